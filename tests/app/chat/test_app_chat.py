"""Chatting in the main window against a fake model on a real engine thread."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont

from app.chat.welcome import SUGGESTED_PROMPTS
from engine.protocol.messages import ChatMessage


def test_enter_sends_one_request_and_the_reply_streams_into_the_view(chat, script):
    chat.wait_until_ready()
    chat.type_and_press_enter("What is a hearth?")
    chat.qtbot.waitUntil(lambda: "Hello" in chat.shown_texts()[-1], timeout=5000)
    chat.wait_until_reply_ends()

    assert len(script.generates) == 1
    assert script.generates[0].messages == (ChatMessage("user", "What is a hearth?"),)
    assert chat.prompt.toPlainText() == ""
    assert chat.shown_texts()[0] == "What is a hearth?"
    assert chat.last_reply().content == script.full_reply
    assert chat.last_reply().state == "done"
    assert chat.shown_texts()[-1] == "Hello from the fake model."
    reply_document = chat.window.chat_view.bubbles[-1].body.document()
    assert reply_document.find("fake").charFormat().fontWeight() == QFont.Weight.Bold


def test_shift_enter_inserts_a_line_break_and_does_not_send(chat, script):
    chat.wait_until_ready()
    chat.qtbot.keyClicks(chat.prompt, "first line")
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    chat.qtbot.keyClicks(chat.prompt, "second line")
    chat.qtbot.wait(50)

    assert chat.prompt.toPlainText() == "first line\nsecond line"
    assert script.generates == []
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)
    chat.wait_until_reply_ends()
    assert script.generates[0].messages[-1].content == "first line\nsecond line"


def _stop_mid_reply(chat, script, stop) -> None:
    script.reply_tokens = tuple(f" word{index}" for index in range(400))
    script.token_delay_s = 0.01
    chat.wait_until_ready()
    chat.type_and_press_enter("Tell me a long story")
    chat.qtbot.waitUntil(lambda: chat.last_reply().content.count("word") >= 3, timeout=5000)
    assert chat.window.input_bar.stop_button.isEnabled()
    assert not chat.window.input_bar.send_button.isEnabled()
    stop()
    chat.wait_until_reply_ends()


def test_stop_button_ends_the_reply_and_keeps_the_partial_text(chat, script):
    _stop_mid_reply(chat, script, lambda: chat.qtbot.mouseClick(chat.window.input_bar.stop_button, Qt.MouseButton.LeftButton))

    reply = chat.last_reply()
    assert reply.state == "interrupted"
    assert 3 <= reply.content.count("word") < 400
    assert "word0" in chat.shown_texts()[-1]
    assert "Stopped" in chat.window.chat_view.bubbles[-1].note.text()
    assert not chat.window.input_bar.stop_button.isEnabled()
    assert chat.window.input_bar.send_button.isEnabled()


def test_escape_stops_the_reply(chat, script):
    _stop_mid_reply(chat, script, lambda: chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Escape))

    assert chat.last_reply().state == "interrupted"
    assert chat.last_reply().content.count("word") < 400


def test_second_turn_sends_the_whole_history(chat, script):
    chat.wait_until_ready()
    chat.type_and_press_enter("First question")
    chat.wait_until_reply_ends()
    chat.type_and_press_enter("Second question")
    chat.wait_until_reply_ends()

    assert [request.messages for request in script.generates][1] == (
        ChatMessage("user", "First question"),
        ChatMessage("assistant", script.full_reply),
        ChatMessage("user", "Second question"),
    )
    assert script.generates[0].conversation_id == script.generates[1].conversation_id
    assert len(chat.window.chat_view.bubbles) == 4


def test_a_stopped_reply_is_part_of_the_next_turns_history(chat, script):
    _stop_mid_reply(chat, script, chat.window.session.stop)
    partial = chat.last_reply().content
    chat.type_and_press_enter("Go on")
    chat.qtbot.waitUntil(lambda: len(script.generates) == 2, timeout=5000)

    assert script.generates[1].messages[1] == ChatMessage("assistant", partial)


def test_enter_before_the_model_is_loaded_keeps_the_text_and_says_why(chat, script, window, qtbot):
    script.load_delay_s = 0.5
    window.session.load_model("another-model")  # the fixture's first load is still queued: no model yet
    chat.type_and_press_enter("Too early")

    assert chat.prompt.toPlainText() == "Too early"
    assert "No model is loaded yet" in window.status_line.currentMessage()
    assert "Your message is kept" in window.status_line.currentMessage()
    chat.wait_until_ready()
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)
    chat.wait_until_reply_ends()
    assert [request.messages[-1].content for request in script.generates] == ["Too early"]


def test_empty_prompt_sends_nothing(chat, script):
    chat.wait_until_ready()
    chat.type_and_press_enter("   ")
    chat.qtbot.wait(50)

    assert script.generates == []
    assert chat.window.chat_view.bubbles == ()


def test_a_new_conversation_starts_empty_with_its_own_id(chat, script, window):
    chat.wait_until_ready()
    chat.type_and_press_enter("First chat")
    chat.wait_until_reply_ends()
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat.qtbot.waitUntil(lambda: window.chat_view.bubbles == (), timeout=2000)
    chat.type_and_press_enter("Second chat")
    chat.wait_until_reply_ends()

    assert script.generates[1].messages == (ChatMessage("user", "Second chat"),)
    assert script.generates[1].conversation_id != script.generates[0].conversation_id
    assert len(window.chat_view.bubbles) == 2


def test_stop_says_stopping_until_the_reply_ends(chat, script, window, qtbot):
    script.interleave = True  # the fake then sees the Cancel only at its next step, as the engine does
    script.reply_tokens = tuple(f" word{index}" for index in range(400))
    script.token_delay_s = 0.05
    chat.wait_until_ready()
    chat.type_and_press_enter("Tell me a long story")
    qtbot.waitUntil(lambda: "word2" in chat.last_reply().content, timeout=5000)
    stop = window.input_bar.stop_button

    qtbot.mouseClick(stop, Qt.MouseButton.LeftButton)
    assert (stop.text(), stop.isEnabled()) == ("Stopping…", False)
    chat.wait_until_reply_ends()
    assert (stop.text(), stop.isEnabled()) == ("Stop", False)


def test_copy_says_copied_for_a_moment(chat, window, qtbot):
    chat.send_and_wait("Hi")
    card = window.chat_view.bubbles[-1]
    card.copy_button.click()

    assert card.copy_button.text() == "Copied"
    qtbot.waitUntil(lambda: card.copy_button.text() == "Copy", timeout=3000)


def test_a_new_conversation_offers_prompts_to_start_from(chat, window, qtbot):
    chat.wait_until_ready()
    assert window.welcome.isVisible() and not window.chat_view.isVisible()

    qtbot.mouseClick(window.welcome.buttons[1], Qt.MouseButton.LeftButton)
    assert chat.prompt.toPlainText() == SUGGESTED_PROMPTS[1]
    qtbot.keyClick(chat.prompt, Qt.Key.Key_Return)
    chat.wait_until_reply_ends()

    assert window.chat_view.isVisible() and not window.welcome.isVisible()
    assert chat.shown_texts()[0] == SUGGESTED_PROMPTS[1]
