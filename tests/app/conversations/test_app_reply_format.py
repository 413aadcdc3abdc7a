"""Conversation settings > Reply format: JSON mode and a pasted JSON schema reach the engine as the reply's
constraint; a schema that cannot be used is named and nothing changes."""

from __future__ import annotations

import json

from app.conversations.conversation_settings import open_conversation_settings
from app.conversations.reply_format import ReplyFormat
from engine.protocol.messages import Constraint

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def _choose(dialog, kind: str, schema: str = "") -> None:
    dialog.reply_kind.setCurrentIndex(dialog.reply_kind.findData(kind))
    dialog.schema.setPlainText(schema)


def test_json_mode_asks_the_engine_for_a_json_object(chat, script):
    chat.send_and_wait("Hello")
    dialog = open_conversation_settings(chat.window)
    _choose(dialog, "json")
    dialog.accept()
    chat.send_and_wait("Again")

    assert script.generates[-1].constraint == Constraint("json_object", "")
    assert script.generates[0].constraint is None


def test_a_pasted_schema_is_the_replies_constraint(chat, script):
    chat.send_and_wait("Hello")
    dialog = open_conversation_settings(chat.window)
    _choose(dialog, "json_schema", json.dumps(SCHEMA))
    assert dialog.schema.isVisibleTo(dialog)
    dialog.accept()
    chat.send_and_wait("Again")

    constraint = script.generates[-1].constraint
    assert constraint.kind == "json_schema" and json.loads(constraint.spec) == SCHEMA


def test_an_invalid_schema_is_named_and_not_saved(chat, script):
    chat.send_and_wait("Hello")
    dialog = open_conversation_settings(chat.window)
    _choose(dialog, "json_schema", '{"type": "object", "properties": ')
    dialog.accept()

    assert dialog.isVisible() and "not valid JSON" in dialog.error_label.text()
    _choose(dialog, "json_schema", '{"type": "frog"}')
    dialog.accept()
    assert dialog.isVisible() and "frog" in dialog.error_label.text()
    dialog.reject()
    chat.send_and_wait("Again")
    assert script.generates[-1].constraint is None


def test_free_text_needs_no_schema():
    assert ReplyFormat("text", "nonsense").constraint() is None
    assert ReplyFormat("text", "nonsense").schema_problem() == ""
    assert "Paste a JSON schema" in ReplyFormat("json_schema", " ").schema_problem()
