"""Conversations survive a restart: what was sent and replied is in the store and shown again."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.conversations.sidebar import Sidebar
from app.storage import StorageError
from engine.protocol.messages import ChatMessage


def test_a_conversation_is_shown_again_after_a_restart_with_its_title(chat, script, reopen):
    chat.send_and_wait("Why do fires crackle?")

    again = reopen()

    texts = [message.content for message in again.session.conversation.messages]
    assert texts == ["Why do fires crackle?", script.full_reply]
    assert again.session.conversation.messages[-1].state == "done"
    assert again.findChild(Sidebar).titles() == ["Why do fires crackle?"]


def test_the_engine_conversation_id_is_the_stored_one(chat, script):
    chat.send_and_wait("Hello")

    stored = chat.window.journal.store.list_conversations()
    assert [summary.id for summary in stored] == [script.generates[0].conversation_id]


def test_the_system_prompt_leads_the_history_and_a_stopped_reply_is_kept_as_a_turn(chat, script):
    chat.window.journal.set_conversation_settings(chat.window.session.conversation, "Answer briefly.", None)
    script.reply_tokens = tuple(f" w{index}" for index in range(300))
    script.token_delay_s = 0.01
    chat.wait_until_ready()
    chat.type_and_press_enter("Count")
    chat.qtbot.waitUntil(lambda: chat.last_reply().content.count("w") >= 3, timeout=5000)
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Escape)
    chat.wait_until_reply_ends()
    partial = chat.last_reply().content
    script.reply_tokens, script.token_delay_s = ("ok",), 0.0
    chat.send_and_wait("Go on")

    assert script.generates[1].messages == (
        ChatMessage("system", "Answer briefly."),
        ChatMessage("user", "Count"),
        ChatMessage("assistant", partial),
        ChatMessage("user", "Go on"),
    )


def test_turns_dropped_from_the_context_are_marked_and_remembered(chat, script, reopen):
    chat.send_and_wait("First")
    script.dropped_turns = (0, 1)
    chat.send_and_wait("Second")

    notes = [bubble.note.text() for bubble in chat.window.chat_view.bubbles]
    assert "Left out of the model's context" in notes[0] and "Left out of the model's context" in notes[1]
    assert "Left out" not in notes[2]
    assert [m.dropped for m in reopen().session.conversation.messages] == [True, True, False, False]


def test_a_message_that_cannot_be_saved_is_not_sent_and_stays_in_the_box(chat, script, monkeypatch):
    def disk_full(*_args):
        raise StorageError("Could not save your message: the disk is full.")

    monkeypatch.setattr(chat.window.journal.store, "add_user_message", disk_full)
    chat.wait_until_ready()
    chat.type_and_press_enter("Keep me")
    chat.qtbot.wait(50)

    assert script.generates == []
    assert chat.prompt.toPlainText() == "Keep me"
    assert "disk is full" in chat.window.status_line.currentMessage()
