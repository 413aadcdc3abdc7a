"""The real window, the real engine thread and the real built-in model: a question gets a right answer.

Slow (the built-in model loads in seconds, then answers on the CPU), and skipped
when the built-in model has not been fetched (``make test`` fetches it first).
"""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.controller import EngineController
from app.storage import SamplingSettings
from app.window.main_window import MainWindow
from engine.service.client import AsyncEngine

LOAD_TIMEOUT_MS = 600_000
REPLY_TIMEOUT_MS = 300_000


def test_the_built_in_model_answers_paris_in_the_window(qtbot, qasync_loop, default_model_path) -> None:
    controller = EngineController()
    window = MainWindow(controller)
    qtbot.addWidget(window)
    window.show()
    window.settings_holder.update(sampling=SamplingSettings(temperature=0.0))  # greedy: the same answer every run
    controller.start(AsyncEngine())
    try:
        window.session.load_model(str(default_model_path))
        qtbot.waitUntil(window.input_bar.send_button.isEnabled, timeout=LOAD_TIMEOUT_MS)
        prompt = window.input_bar.prompt
        qtbot.keyClicks(prompt, "What is the capital of France? Answer in one word.")
        qtbot.keyClick(prompt, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: window.session.generating, timeout=5_000)
        qtbot.waitUntil(lambda: not window.session.generating, timeout=REPLY_TIMEOUT_MS)
        reply = window.session.conversation.messages[-1]
        assert reply.role == "assistant"
        assert "Paris" in reply.content
        assert "Paris" in window.chat_view.bubbles[-1].shown_text()
    finally:
        controller.close()
