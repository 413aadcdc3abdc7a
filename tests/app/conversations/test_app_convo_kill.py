"""kill -9 during a reply, or two: the next start shows each partial reply, marked interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TARGET = Path(__file__).with_name("endless_reply_app.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


def _run_until_killed(hearth_home, *arguments: str, lines: int = 1) -> list[list[int]]:
    """Run the endless app, read ``lines`` lines of lengths it printed, then kill -9 it."""
    environment = {**os.environ, "HEARTH_HOME": str(hearth_home), "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, str(TARGET), *arguments]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment, cwd=REPO_ROOT)
    try:
        return [[int(length) for length in process.stdout.readline().split()] for _ in range(lines)]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)


def test_a_reply_cut_by_kill_9_comes_back_interrupted(hearth_home, reopen):
    [[shown_length]] = _run_until_killed(hearth_home)

    window = reopen()

    user, reply = window.session.conversation.messages
    assert user.content == "Tell me everything"
    assert reply.state == "interrupted"
    assert reply.content.startswith("word0 word1 ")
    assert len(reply.content) > shown_length / 3
    assert "Stopped" in window.chat_view.bubbles[-1].note.text()
    assert "cut off" in window.status_line.currentMessage()


def test_two_replies_cut_by_kill_9_both_come_back_interrupted(hearth_home, reopen):
    _first, [first_length, second_length] = _run_until_killed(hearth_home, "two", lines=2)

    window = reopen()

    store = window.journal.store
    replies = {}
    for summary in store.list_conversations():
        user, reply = store.load_conversation(summary.id).messages
        replies[user.content] = reply
    assert set(replies) == {"Tell me everything", "Tell me more"}
    for reply, shown_length in ((replies["Tell me everything"], first_length), (replies["Tell me more"], second_length)):
        assert reply.state == "interrupted"
        assert reply.content.startswith("word0 word1 ") and len(reply.content) > shown_length / 3
    assert window.session.conversation.messages[-1].state == "interrupted"
    assert "2 reply(s) were cut off" in window.status_line.currentMessage()
