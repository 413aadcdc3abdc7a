"""A long conversation (1,000 messages) loads completely; the time is printed, not asserted."""

from __future__ import annotations

import time
from pathlib import Path

from app.storage import ChatStore


def test_conversation_with_1000_messages_loads(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    for turn in range(500):
        store.add_user_message(conversation.id, f"question {turn} " + "lorem ipsum " * 20)
        store.finish_reply(store.begin_reply(conversation.id), f"answer {turn} " + "dolor sit " * 80,
                           stats={"tokens_generated": 160})
    store.close()
    reopened = ChatStore.open(db_path)

    started = time.perf_counter()
    loaded = reopened.load_conversation(conversation.id)
    elapsed_ms = (time.perf_counter() - started) * 1000
    reopened.close()

    print(f"\nload_conversation with 1,000 messages: {elapsed_ms:.1f} ms")
    assert len(loaded.messages) == 1000
    assert [m.position for m in loaded.messages] == list(range(1000))
    assert loaded.messages[-1].content.startswith("answer 499 ")
