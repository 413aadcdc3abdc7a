"""Loading a model: progress, cancelling, failures, notices, and the performance dock."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

FAKE_READY = "Ready: Fake model on cpu (fp32)"


def _visible_error_dialogs(window) -> list[QMessageBox]:
    return [box for box in window.findChildren(QMessageBox) if box.isVisible()]


def test_cancelling_a_slow_load_keeps_the_previous_model(qtbot, chat, window, script):
    chat.wait_until_ready()
    script.load_delay_s = 3.0
    window.model_loader.load("/models/slow.gguf")
    progress = window.model_loader.progress
    qtbot.waitUntil(lambda: progress.bar.value() >= 1, timeout=5000)
    assert progress.isVisible()
    assert progress.bar.maximum() == 10
    assert window.input_bar.send_button.isEnabled(), "the loaded model goes on answering during the load"

    qtbot.mouseClick(progress.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not progress.isVisible(), timeout=5000)

    qtbot.waitUntil(lambda: window.status_line.state_label.text() == FAKE_READY, timeout=5000)
    # The fake answers so only when it saw the Cancel request between two load steps.
    assert window.status_line.currentMessage() == "Loading was cancelled; the previous model stays."
    assert _visible_error_dialogs(window) == []
    assert window.input_bar.send_button.isEnabled()


def test_a_failed_load_shows_its_message_in_a_dialog_and_the_app_carries_on(qtbot, chat, window, script):
    chat.wait_until_ready()
    window.model_loader.load(script.broken_path)
    qtbot.waitUntil(lambda: bool(_visible_error_dialogs(window)), timeout=5000)

    assert _visible_error_dialogs(window)[0].text() == "No model found at broken-model: pick a folder or .gguf file."
    assert not window.model_loader.progress.isVisible()
    qtbot.waitUntil(lambda: window.status_line.state_label.text() == FAKE_READY, timeout=5000)
    _visible_error_dialogs(window)[0].accept()
    chat.type_and_press_enter("Still there?")
    chat.wait_until_reply_ends()
    assert chat.last_reply().content == script.full_reply


def test_the_notices_of_a_loaded_model_are_shown(qtbot, chat, window):
    chat.wait_until_ready()
    window.model_loader.load("/models/plain-llama")

    qtbot.waitUntil(lambda: "no chat template" in window.status_line.currentMessage(), timeout=5000)
    assert window.status_line.currentMessage().startswith("Fake plain-llama:")
    assert window.status_line.currentMessage() in window.status_line.toolTip(), "read whole where the bar cuts it"
    assert "\nno chat template: using a plain one" in window.status_line.state_label.toolTip()
    window.status_line.clearMessage()
    assert window.status_line.toolTip() == ""
    assert "no chat template" in window.status_line.state_label.toolTip(), "the model's notices stay at hand"


def test_view_performance_shows_the_dock_and_it_follows_the_replies(qtbot, chat, window):
    dock = window.performance_dock
    view_menu = next(action.menu() for action in window.menuBar().actions() if action.text() == "&View")
    toggle = next(action for action in view_menu.actions() if action.text() == "Performance")
    assert not dock.isVisible()

    toggle.trigger()
    assert dock.isVisible()
    assert window.dockWidgetArea(dock) == Qt.DockWidgetArea.RightDockWidgetArea
    chat.wait_until_ready()
    chat.type_and_press_enter("Hi")
    chat.wait_until_reply_ends()
    qtbot.waitUntil(lambda: dock.panel.value_text("decode_speed") == "123 tok/s", timeout=5000)

    toggle.trigger()
    assert not dock.isVisible()
