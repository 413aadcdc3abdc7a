"""What the status line says, and what the user sees when something fails."""

from __future__ import annotations

import asyncio
import threading

from PySide6.QtWidgets import QApplication, QMessageBox

from app.main import run_window
from app.window.main_window import MainWindow


def test_status_line_says_ready_generating_and_the_last_reply_speed(chat, script, window):
    script.token_delay_s = 0.02
    chat.wait_until_ready()
    assert window.status_line.state_label.text().startswith("Ready: Fake model on cpu (fp32)")
    assert window.status_line.stats_label.text() == ""

    chat.type_and_press_enter("Hi")
    chat.qtbot.waitUntil(lambda: window.status_line.state_label.text().startswith("Generating"), timeout=5000)
    chat.wait_until_reply_ends()

    assert window.status_line.state_label.text() == "Ready: Fake model on cpu (fp32)"
    stats = window.status_line.stats_label.text()
    assert "123.4 tokens/s" in stats
    assert "first token after 42 ms" in stats


def _error_dialogs(window: MainWindow) -> list[QMessageBox]:
    return [box for box in window.findChildren(QMessageBox) if box.isVisible()]


def test_a_failed_load_is_explained_and_the_previous_model_stays(chat, script, window):
    chat.wait_until_ready()
    window.session.load_model(script.broken_path)
    chat.qtbot.waitUntil(lambda: bool(_error_dialogs(window)), timeout=5000)

    assert "No model found at broken-model" in _error_dialogs(window)[0].text()
    chat.qtbot.waitUntil(lambda: window.status_line.state_label.text() == "Ready: Fake model on cpu (fp32)")
    assert window.input_bar.send_button.isEnabled()
    _error_dialogs(window)[0].accept()

    window.session.load_model("fake-model")
    chat.wait_until_ready()
    chat.type_and_press_enter("Still there?")
    chat.wait_until_reply_ends()
    assert chat.last_reply().content == script.full_reply


def test_a_failed_reply_keeps_its_partial_text_and_says_why(chat, script, window):
    script.reply_failure = "CUDA out of memory"
    chat.wait_until_ready()
    chat.type_and_press_enter("Hi")
    chat.wait_until_reply_ends()

    reply = chat.last_reply()
    assert (reply.state, reply.content) == ("error", "Hello from")
    assert "Hello from" in chat.shown_texts()[-1]
    assert "CUDA out of memory" in window.chat_view.bubbles[-1].note.text()
    assert "CUDA out of memory" in window.status_line.currentMessage()
    assert window.input_bar.send_button.isEnabled()


def test_an_engine_error_during_a_reply_ends_it_and_opens_a_dialog(chat, script, window):
    script.crash = "device lost"
    chat.wait_until_ready()
    chat.type_and_press_enter("Hi")
    chat.wait_until_reply_ends()

    assert chat.last_reply().state == "error"
    assert chat.last_reply().content == "Hello from"
    assert "RuntimeError: device lost" in _error_dialogs(window)[0].text()
    assert "RuntimeError: device lost" in window.status_line.currentMessage()
    assert window.input_bar.send_button.isEnabled()


def _hearth_engine_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "hearth-engine"]


def test_closing_the_window_while_a_reply_streams_stops_the_engine(qtbot, qasync_loop, fake_engine_factory, script):
    script.reply_tokens = tuple(f" word{index}" for index in range(2000))
    script.token_delay_s = 0.01
    app_run = asyncio.ensure_future(run_window("fake-model", fake_engine_factory))
    qtbot.waitUntil(lambda: any(isinstance(w, MainWindow) and w.isVisible() for w in QApplication.topLevelWidgets()))
    window = next(w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible())
    qtbot.waitUntil(window.input_bar.send_button.isEnabled, timeout=5000)
    window.session.send("Write forever")
    qtbot.waitUntil(lambda: "word5" in window.session.conversation.messages[-1].content, timeout=5000)

    window.close()
    qtbot.waitUntil(app_run.done, timeout=5000)

    assert app_run.result() == 0
    assert script.closed.is_set()
    assert _hearth_engine_threads() == []
    assert len(script.generates) == 1


def test_long_status_texts_never_widen_the_window_and_stay_plain_text(chat, window, qtbot):
    chat.wait_until_ready()
    window.resize(900, 600)
    qtbot.wait(50)
    line = window.status_line
    long_name = "<b>model</b> " + "very-long-name-" * 40

    line.show_notice("Loaded " + long_name)
    line.stats_label.set_text("Last reply: " + long_name)
    window.model_loader.load("/models/" + long_name)
    qtbot.waitUntil(lambda: "very-long" in line.state_label.text(), timeout=5000)
    qtbot.wait(50)

    assert window.width() == 900
    assert window.minimumSizeHint().width() <= 900
    assert "&lt;b&gt;" in line.toolTip() and "b&gt;" in line.state_label.toolTip()  # shown as typed


def test_the_status_line_speaks_of_the_conversation_on_screen(chat, script, window, qtbot):
    script.interleave = True
    script.token_delay_s = 0.03
    script.replies_by_prompt = {"Long": tuple(f" w{index}" for index in range(150))}  # still going on a busy machine
    chat.wait_until_ready()
    chat.type_and_press_enter("Long")
    long_conversation = window.session.conversation
    window.conversations.new_conversation()
    chat.type_and_press_enter("Short")
    qtbot.waitUntil(lambda: not window.session.generating, timeout=5000)
    assert "123.4 tokens/s" in window.status_line.stats_label.text()

    window.session.show_conversation(long_conversation)

    assert window.session.generating, "the long reply is still being written"
    assert window.status_line.state_label.text().startswith("Generating")
    assert window.status_line.stats_label.text() == "", "the short reply's figures are not this conversation's"
    qtbot.waitUntil(lambda: not window.session.generating, timeout=20_000)
    assert window.status_line.state_label.text().startswith("Ready")
    assert "123.4 tokens/s" in window.status_line.stats_label.text()


def test_the_window_comes_back_at_the_size_it_was_closed_at(chat, window, reopen, qtbot):
    window.resize(777, 555)  # within the offscreen screen, which restoreGeometry keeps a window on
    qtbot.waitUntil(lambda: window.width() == 777)
    window.close()

    reopened = reopen()

    assert (reopened.width(), reopened.height()) == (777, 555)


def test_the_status_line_names_an_int8_kv_cache_and_a_draft_model():
    from app.window.status_line import describe_model
    from engine.protocol.messages import ModelLoaded

    plain = ModelLoaded("r", "Big", "/big.gguf", "cpu", "int4 weights", 8192, 1.0, kv_cache="bf16")
    chosen = ModelLoaded("r", "Big", "/big.gguf", "cpu", "int4 weights", 8192, 1.0, kv_cache="int8",
                         draft_model="SmolLM2-135M")
    assert describe_model(plain) == "Big on cpu (int4 weights)"
    assert describe_model(chosen) == "Big on cpu (int4 weights; int8 KV cache; drafting with SmolLM2-135M)"


def test_a_notice_has_room_beside_the_last_replys_figures(chat, window, qtbot):
    """A notice hides the model's line, not the figures on the right: it is drawn between the left edge and them."""
    chat.wait_until_ready()
    window.resize(900, 600)
    line = window.status_line
    line.stats_label.set_text("Last reply: 53 tokens, 105.2 tokens/s, first token after 421 ms")
    notice = "Set up to run fast on this computer (point here for the details)."
    line.show_notice(notice)
    qtbot.wait(50)

    area = line.notice_area()
    figures = line.stats_label
    figures_left = figures.x() + figures.width() - figures.fontMetrics().horizontalAdvance(figures.text())
    assert area.width() >= line.fontMetrics().horizontalAdvance(notice), "the whole notice fits at 900 px"
    assert area.right() < figures_left, "never under the figures"
