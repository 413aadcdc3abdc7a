"""Streamed replies: periodic checkpoints, finishing, and recovery after a crash or kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.storage import ChatStore, ReplyRecorder
from engine.protocol.messages import RequestStats

WRITER = Path(__file__).with_name("reply_writer.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


def _saved_text(store: ChatStore, conversation_id: str) -> str:
    return store.load_conversation(conversation_id).messages[-1].content


def test_recorder_checkpoints_once_a_second_and_on_flush(store: ChatStore) -> None:
    conversation = store.create_conversation()
    recorder = ReplyRecorder.start(store, conversation.id, now=100.0)

    assert recorder.append("Hel", now=100.4) is False
    assert _saved_text(store, conversation.id) == ""
    assert recorder.append("lo", now=101.0) is True
    assert _saved_text(store, conversation.id) == "Hello"
    assert recorder.append(",", now=101.9) is False
    assert recorder.append(" you", now=102.0) is True
    assert _saved_text(store, conversation.id) == "Hello, you"
    recorder.append("!", now=102.1)
    assert recorder.flush() is True
    assert recorder.flush() is False
    assert _saved_text(store, conversation.id) == "Hello, you!"
    assert store.load_conversation(conversation.id).messages[-1].state == "streaming"


def test_finish_commits_final_text_state_and_stats(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "Hi")
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    recorder.append("Hello the", now=0.5)
    stats = RequestStats(prompt_tokens=9, tokens_generated=3, decode_tok_s=41.5, dropped_turns=(0,))

    recorder.finish(stats=stats, text="Hello there")
    store.close()

    reply = ChatStore.open(db_path).load_conversation(conversation.id).messages[-1]
    assert (reply.content, reply.state) == ("Hello there", "done")
    assert reply.stats is not None
    assert reply.stats["decode_tok_s"] == 41.5 and reply.stats["dropped_turns"] == [0]
    assert reply.stats["memory"]["device"] == "cpu"
    with pytest.raises(RuntimeError):
        recorder.append("more", now=1.0)


def test_failed_reply_keeps_partial_text(store: ChatStore) -> None:
    conversation = store.create_conversation()
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    recorder.append("Half an ans", now=0.2)
    recorder.finish(state="error")
    reply = store.load_conversation(conversation.id).messages[-1]
    assert (reply.content, reply.state) == ("Half an ans", "error")


def test_finish_rejects_a_non_final_state(store: ChatStore) -> None:
    conversation = store.create_conversation()
    message_id = store.begin_reply(conversation.id)
    with pytest.raises(ValueError, match="streaming"):
        store.finish_reply(message_id, "x", state="streaming")


def test_recovery_marks_streaming_replies_interrupted(store: ChatStore) -> None:
    conversation = store.create_conversation()
    done = store.begin_reply(conversation.id)
    store.finish_reply(done, "complete")
    left = store.begin_reply(conversation.id)
    store.checkpoint_reply(left, "partial")

    recovered = store.recover_interrupted()

    assert [(m.id, m.content, m.state) for m in recovered] == [(left, "partial", "interrupted")]
    states = [m.state for m in store.load_conversation(conversation.id).messages]
    assert states == ["done", "interrupted"]
    assert store.recover_interrupted() == []


def _read_until_killed(process: subprocess.Popen[str], after_kill_s: float) -> list[str]:
    """Read the writer's lines; SIGKILL it ``after_kill_s`` after its second checkpoint."""
    assert process.stdout is not None
    lines: list[str] = []
    checkpoints, kill_at = 0, None
    while kill_at is None or time.monotonic() < kill_at:
        line = process.stdout.readline()
        if not line:
            pytest.fail(f"writer stopped early: {process.stderr.read() if process.stderr else ''}")
        lines.append(line.strip())
        if line.startswith("checkpoint"):
            checkpoints += 1
            if checkpoints == 2:
                kill_at = time.monotonic() + after_kill_s
    os.kill(process.pid, signal.SIGKILL)
    rest, _ = process.communicate(timeout=10)
    complete = rest.splitlines() if rest.endswith("\n") else rest.splitlines()[:-1]  # a cut-off last line
    return lines + complete


def test_kill_during_reply_loses_at_most_the_last_second(db_path: Path) -> None:
    environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, str(WRITER), str(db_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=environment,
    )
    try:
        output = _read_until_killed(process, after_kill_s=1.5)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    conversation_id = output[0].split()[1]
    appends = [(int(line.split()[1]), float(line.split()[2])) for line in output if line.startswith("append")]

    store = ChatStore.open(db_path)
    recovered = store.recover_interrupted()
    conversation = store.load_conversation(conversation_id)
    store.close()

    assert [(m.role, m.state) for m in conversation.messages] == [("user", "done"), ("assistant", "interrupted")]
    reply = conversation.messages[1]
    assert [m.id for m in recovered] == [reply.id]
    produced = "".join(f"w{i:05d} " for i in range(len(appends)))
    assert len(reply.content) >= 2 * len("w00000 ")  # at least the two checkpoints seen
    assert produced.startswith(reply.content)
    saved_at = next(t for chars, t in appends if chars == len(reply.content))
    # Every chunk produced before the last one came less than a second after the saved one
    # (the last may be the one whose checkpoint the kill interrupted).
    assert appends[-2][1] - saved_at < 1.0
