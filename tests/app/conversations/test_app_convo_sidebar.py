"""The conversation sidebar: newest first, new (Ctrl+N), switch, rename, delete with undo, search."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit

from app.conversations.sidebar import Sidebar


def _sidebar(chat) -> Sidebar:
    return chat.window.findChild(Sidebar)


def _two_conversations(chat) -> None:
    chat.send_and_wait("About apples")
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat.send_and_wait("About pears")


def test_ctrl_n_starts_a_new_conversation_listed_newest_first_once_it_has_a_message(chat):
    chat.send_and_wait("About apples")
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)

    assert chat.window.chat_view.bubbles == ()
    assert chat.sidebar_titles() == ["About apples"]
    chat.send_and_wait("About pears")
    assert chat.sidebar_titles() == ["About pears", "About apples"]


def test_choosing_a_conversation_with_the_keyboard_opens_it(chat):
    _two_conversations(chat)
    conversation_list = _sidebar(chat).list
    conversation_list.setFocus()
    conversation_list.setCurrentRow(1)
    chat.qtbot.keyClick(conversation_list, Qt.Key.Key_Return)
    chat.wait_until_cards_are_made()

    assert chat.shown_texts()[0] == "About apples"


def test_f2_renames_in_place_and_the_title_is_kept(chat, reopen):
    _two_conversations(chat)
    conversation_list = _sidebar(chat).list
    conversation_list.setFocus()
    conversation_list.setCurrentRow(0)
    chat.qtbot.keyClick(conversation_list, Qt.Key.Key_F2)
    editor = conversation_list.findChild(QLineEdit)
    editor.selectAll()
    chat.qtbot.keyClicks(editor, "Pear notes")
    chat.qtbot.keyClick(editor, Qt.Key.Key_Return)

    chat.qtbot.waitUntil(lambda: chat.sidebar_titles()[0] == "Pear notes", timeout=2000)
    assert reopen().findChild(Sidebar).titles()[0] == "Pear notes"


def test_delete_hides_a_conversation_and_undo_brings_it_back(chat, reopen):
    _two_conversations(chat)
    sidebar = _sidebar(chat)
    sidebar.list.setFocus()
    sidebar.list.setCurrentRow(1)
    chat.qtbot.keyClick(sidebar.list, Qt.Key.Key_Delete)

    assert chat.sidebar_titles() == ["About pears"]
    assert sidebar.undo_button.isVisible()
    chat.qtbot.mouseClick(sidebar.undo_button, Qt.MouseButton.LeftButton)
    assert chat.sidebar_titles() == ["About pears", "About apples"]
    chat.wait_until_cards_are_made()
    assert chat.shown_texts()[0] == "About apples"
    assert not sidebar.undo_button.isVisible()


def test_deleting_the_open_conversation_shows_an_empty_one_and_survives_a_restart(chat, reopen):
    _two_conversations(chat)
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)

    assert chat.window.chat_view.bubbles == ()
    assert reopen().findChild(Sidebar).titles() == ["About apples"]


def test_search_finds_titles_and_message_text(chat, script):
    script.reply_tokens = ("Pears are ", "sweet and grainy.")
    _two_conversations(chat)
    search_box = _sidebar(chat).search_box
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert search_box.hasFocus()

    chat.qtbot.keyClicks(search_box, "apples")
    assert chat.sidebar_titles() == ["About apples"]
    search_box.clear()
    chat.qtbot.keyClicks(search_box, "GRAINY")
    assert chat.sidebar_titles() == ["About pears", "About apples"]
    search_box.clear()
    chat.qtbot.keyClicks(search_box, "plums")
    assert chat.sidebar_titles() == []


def test_conversations_of_the_same_title_are_told_apart_by_when_they_were_last_used(chat):
    chat.send_and_wait("Hi")
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat.qtbot.wait(1100)  # the tooltip tells the second
    chat.send_and_wait("Hi")
    conversation_list = _sidebar(chat).list

    tips = [conversation_list.item(row).toolTip() for row in range(conversation_list.count())]

    assert chat.sidebar_titles() == ["Hi", "Hi"]
    assert all("Last used" in tip for tip in tips)
    assert tips[0] != tips[1]
