"""Actions on messages: copy a message or a code block, regenerate, edit an earlier message, delete."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextCursor

from engine.protocol.messages import ChatMessage


def _menu_action(chat, bubble_index: int, action_name: str) -> None:
    bubble = chat.window.chat_view.bubbles[bubble_index]
    menu = bubble.actions_menu()
    action = next(a for a in menu.actions() if a.text().replace("&", "").startswith(action_name))
    action.trigger()


def _click_copy_code_link(chat, body, occurrence: int) -> None:
    """Click the ``occurrence``-th "Copy code" link of a reply where it is drawn."""
    found = QTextCursor(body.document())
    for _ in range(occurrence + 1):
        found = body.document().find("Copy code", found)
    assert found.charFormat().anchorHref().startswith("copy-code:")
    inside = QTextCursor(body.document())
    inside.setPosition(found.selectionStart() + 2)
    chat.qtbot.mouseClick(body.viewport(), Qt.MouseButton.LeftButton, pos=body.cursorRect(inside).center())


def test_copy_buttons_copy_the_message_and_each_code_block(chat, script):
    script.reply_tokens = ("Try:\n\n```python\nprint('one')\n```\n\nor\n\n```bash\necho two\n```\n",)
    chat.send_and_wait("Show code")
    bubble = chat.window.chat_view.bubbles[-1]

    chat.qtbot.mouseClick(bubble.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == script.full_reply
    _click_copy_code_link(chat, bubble.body, 1)
    assert QGuiApplication.clipboard().text() == "echo two"
    _click_copy_code_link(chat, bubble.body, 0)
    assert QGuiApplication.clipboard().text() == "print('one')"


def test_regenerate_replaces_the_reply_and_sends_the_same_history(chat, script, reopen):
    chat.send_and_wait("Name a tree")
    script.reply_tokens = ("Oak.",)
    _menu_action(chat, 1, "Regenerate")
    chat.wait_until_reply_ends()

    assert script.generates[1].messages == (ChatMessage("user", "Name a tree"),)
    assert script.generates[1].conversation_id == script.generates[0].conversation_id
    assert [m.content for m in chat.window.session.conversation.messages] == ["Name a tree", "Oak."]
    assert [m.content for m in reopen().session.conversation.messages] == ["Name a tree", "Oak."]


def test_editing_an_earlier_message_replaces_the_later_turns(chat, script, reopen):
    chat.send_and_wait("Name a tree")
    chat.send_and_wait("And a flower")
    _menu_action(chat, 0, "Edit")
    dialog = chat.window.message_actions.edit_dialog
    dialog.editor.setPlainText("Name a bird")
    script.reply_tokens = ("Robin.",)
    dialog.accept()
    chat.wait_until_reply_ends()

    assert script.generates[-1].messages == (ChatMessage("user", "Name a bird"),)
    assert script.generates[-1].conversation_id == script.generates[0].conversation_id
    assert [m.content for m in reopen().session.conversation.messages] == ["Name a bird", "Robin."]


def test_delete_removes_one_message_for_good(chat, script, reopen):
    chat.send_and_wait("Name a tree")
    _menu_action(chat, 1, "Delete")

    assert len(chat.window.chat_view.bubbles) == 1
    assert [m.content for m in reopen().session.conversation.messages] == ["Name a tree"]


def test_actions_are_refused_while_a_reply_is_written(chat, script):
    chat.send_and_wait("Name a tree")
    script.reply_tokens = tuple(f" w{index}" for index in range(300))
    script.token_delay_s = 0.01
    chat.type_and_press_enter("Another")
    chat.qtbot.waitUntil(lambda: "w3" in chat.last_reply().content, timeout=5000)
    _menu_action(chat, 1, "Delete")

    assert len(chat.window.session.conversation.messages) == 4
    assert "Stop the reply first" in chat.window.status_line.currentMessage()
    chat.qtbot.keyClick(chat.prompt, Qt.Key.Key_Escape)
    chat.wait_until_reply_ends()
