"""Helper process for test_storage_replies.py: streams a reply into a store until it is killed.

Usage: python reply_writer.py DB_PATH. Prints "conversation <id>" once, then for each chunk
"append <total_chars> <monotonic_s>" *before* handing it to the recorder, and
"checkpoint <saved_chars>" after every checkpoint. Chunk i is ``chunk_text(i)``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from app.storage import ChatStore, ReplyRecorder  # noqa: E402

CHUNK_PAUSE_S = 0.01


def chunk_text(index: int) -> str:
    return f"w{index:05d} "


def main(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "Tell me a long story.")
    print(f"conversation {conversation.id}", flush=True)
    recorder = ReplyRecorder.start(store, conversation.id, time.monotonic())
    produced = 0
    for index in range(1_000_000):
        text = chunk_text(index)
        produced += len(text)
        now = time.monotonic()
        print(f"append {produced} {now:.6f}", flush=True)
        if recorder.append(text, now):
            print(f"checkpoint {produced}", flush=True)
        time.sleep(CHUNK_PAUSE_S)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
