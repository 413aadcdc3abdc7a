"""kill -9 during a reply: the next start shows the conversation with the partial reply, marked interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TARGET = Path(__file__).with_name("endless_reply_app.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


def test_a_reply_cut_by_kill_9_comes_back_interrupted(hearth_home, reopen):
    environment = {**os.environ, "HEARTH_HOME": str(hearth_home), "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, str(TARGET)], stdout=subprocess.PIPE, text=True, env=environment, cwd=REPO_ROOT)
    try:
        shown_length = int(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    window = reopen()

    user, reply = window.session.conversation.messages
    assert user.content == "Tell me everything"
    assert reply.state == "interrupted"
    assert reply.content.startswith("word0 word1 ")
    assert len(reply.content) > shown_length / 3
    assert "Stopped" in window.chat_view.bubbles[-1].note.text()
    assert "cut off" in window.status_line.currentMessage()
