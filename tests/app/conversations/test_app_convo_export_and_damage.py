"""File > Export… as Markdown and JSON; a damaged database or row never stops the app."""

from __future__ import annotations

import json
import sqlite3

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.storage.database import default_database_path


def _export_to(chat, monkeypatch, path, chosen_filter) -> None:
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *_args: (str(path), chosen_filter))
    export = next(a for a in chat.window.findChildren(QAction) if "Export" in a.text())
    export.trigger()


def test_export_writes_markdown_and_json(chat, script, monkeypatch, tmp_path):
    chat.send_and_wait("What is a hearth?")

    _export_to(chat, monkeypatch, tmp_path / "hearth.md", "Markdown (*.md)")
    _export_to(chat, monkeypatch, tmp_path / "hearth", "JSON (*.json)")

    markdown = (tmp_path / "hearth.md").read_text(encoding="utf-8")
    assert markdown.startswith("# What is a hearth?") and script.full_reply in markdown
    document = json.loads((tmp_path / "hearth.json").read_text(encoding="utf-8"))
    assert [m["content"] for m in document["messages"]] == ["What is a hearth?", script.full_reply]
    assert "Exported to" in chat.window.status_line.currentMessage()


def test_export_into_a_missing_folder_says_why(chat, monkeypatch, tmp_path):
    chat.send_and_wait("Hi")
    _export_to(chat, monkeypatch, tmp_path / "missing" / "out.md", "Markdown (*.md)")

    assert "Could not export" in chat.window.status_line.currentMessage()


def test_a_damaged_database_is_set_aside_with_a_notice_and_a_fresh_one_works(hearth_home, reopen):
    path = default_database_path()
    path.write_bytes(b"this is not a database" * 100)

    window = reopen()

    notice = window.findChild(QMessageBox, "startupNotice")
    assert notice is not None and "damaged" in notice.text()
    assert list(path.parent.glob("hearth.sqlite3.damaged-*"))
    assert window.journal.store.list_conversations() == []


def test_a_damaged_row_marks_only_its_conversation(chat, reopen):
    chat.send_and_wait("Good one")
    chat.window.conversations.new_conversation()
    chat.send_and_wait("Broken one")
    broken_id = chat.window.session.conversation.id
    with sqlite3.connect(default_database_path()) as connection:
        connection.execute("UPDATE messages SET role = 'wizard' WHERE conversation_id = ? AND position = 0", (broken_id,))

    window = reopen()

    assert "unknown role" in window.session.conversation.damage
    assert "could not be read" in window.chat_view.banner.text() and window.chat_view.banner.isVisible()
    assert [m.content for m in window.session.conversation.messages] == ["Hello from the **fake** model."]
    window.conversations.open(window.journal.store.list_conversations()[1].id)
    assert [m.content for m in window.session.conversation.messages][0] == "Good one"
    assert not window.chat_view.banner.isVisible()
