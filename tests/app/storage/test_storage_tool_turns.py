"""Tool calls, tool turns and each conversation's reply format in the store: saved, read back, migrated, exported."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from app.storage import ChatStore, export_json, export_markdown
from app.storage.records import ToolTurn
from app.storage.store import CUT_OFF_CALL
from engine.protocol.messages import ToolCall

FIXTURES = Path(__file__).with_name("fixtures")
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')


def _conversation_with_a_tool_turn(store: ChatStore) -> tuple[str, str]:
    """A question, a reply that called get_weather, the call's turn (done), and the reply after it."""
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "Weather in Paris?")
    reply = store.begin_reply(conversation.id)
    store.finish_reply(reply, "Let me look.")
    store.set_tool_calls(reply, (CALL,))
    turn = store.add_tool_turn(conversation.id, ToolTurn(CALL.id, CALL.name, CALL.arguments, server="weather"))
    store.update_tool_turn(turn.id, ToolTurn(CALL.id, CALL.name, CALL.arguments, "done", 0.25, "weather"), "Sunny")
    store.finish_reply(store.begin_reply(conversation.id), "It is sunny.")
    return conversation.id, turn.id


def test_tool_calls_and_tool_turns_are_read_back_in_order(store: ChatStore) -> None:
    conversation_id, _turn_id = _conversation_with_a_tool_turn(store)

    messages = store.load_conversation(conversation_id).messages

    assert [(m.role, m.content) for m in messages] == [
        ("user", "Weather in Paris?"), ("assistant", "Let me look."), ("tool", "Sunny"), ("assistant", "It is sunny."),
    ]
    assert messages[1].tool_calls == (CALL,)
    assert messages[2].tool == ToolTurn(CALL.id, CALL.name, CALL.arguments, "done", 0.25, "weather")
    assert messages[3].tool is None and messages[3].tool_calls == ()


def test_a_tool_turn_with_unreadable_json_is_skipped_and_named(store: ChatStore, db_path: Path) -> None:
    conversation_id, turn_id = _conversation_with_a_tool_turn(store)
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE messages SET tool_json = '{\"call_id\": 3' WHERE id = ?", (turn_id,))

    loaded = store.load_conversation(conversation_id)

    assert "unreadable tool calls" in loaded.damage_reason
    assert [m.role for m in loaded.messages] == ["user", "assistant", "assistant"]


def test_reply_format_and_use_tools_are_kept_with_the_conversation(store: ChatStore) -> None:
    conversation = store.create_conversation()
    assert (conversation.reply_kind, conversation.use_tools) == ("text", False)

    store.set_conversation_settings(conversation.id, "", None, "json_schema", '{"type": "object"}', use_tools=True)

    loaded = store.load_conversation(conversation.id)
    assert (loaded.reply_kind, loaded.reply_schema, loaded.use_tools) == ("json_schema", '{"type": "object"}', True)


def test_a_version_1_database_migrates_to_free_text_without_tools_and_takes_tool_turns(tmp_path: Path) -> None:
    path = tmp_path / "hearth.sqlite3"
    shutil.copyfile(FIXTURES / "v1.sqlite3", path)

    store = ChatStore.open(path)
    summary = store.list_conversations()[0]
    before = store.load_conversation(summary.id)
    turn = store.add_tool_turn(summary.id, ToolTurn("call_9", "clock", "{}", "done"), "noon")
    after = store.load_conversation(summary.id)
    store.close()

    assert (before.reply_kind, before.reply_schema, before.use_tools) == ("text", "", False)
    assert all(m.tool is None and m.tool_calls == () for m in before.messages)
    assert after.messages[-1].id == turn.id and after.messages[-1].tool.function_name == "clock"
    assert not after.damaged


def test_markdown_and_json_exports_carry_the_calls_and_their_results(store: ChatStore) -> None:
    conversation_id, _turn_id = _conversation_with_a_tool_turn(store)
    conversation = store.load_conversation(conversation_id)

    markdown = export_markdown(conversation)
    document = json.loads(export_json(conversation))

    order = ["Let me look.", "*Called `get_weather` with:*", '"city": "Paris"', "## Tool: get_weather",
             "*done on weather, 0.25 s*", "Sunny", "It is sunny."]
    positions = [markdown.index(text) for text in order]
    assert positions == sorted(positions)
    assert document["messages"][1]["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert document["messages"][2]["tool"]["status"] == "done" and document["messages"][2]["content"] == "Sunny"
    assert document["use_tools"] is False and document["reply_format"] == {"kind": "text", "schema": ""}


def test_a_result_full_of_backticks_stays_inside_its_fence(store: ChatStore) -> None:
    conversation = store.create_conversation()
    turn = store.add_tool_turn(conversation.id, ToolTurn("c", "shell", "{}", "done"), "```\nrm -rf\n```")

    markdown = export_markdown(store.load_conversation(conversation.id))

    assert f"````text\n{'```'}\nrm -rf\n```\n````" in markdown and turn.tool is not None


def test_recovery_marks_a_call_left_waiting_or_running_as_stopped(store: ChatStore) -> None:
    conversation = store.create_conversation()
    waiting = store.add_tool_turn(conversation.id, ToolTurn("a", "clock", "{}"))
    running = store.add_tool_turn(conversation.id, ToolTurn("b", "clock", "{}", "running"))
    done = store.add_tool_turn(conversation.id, ToolTurn("c", "clock", "{}", "done", 0.1), "noon")

    store.recover_interrupted()

    turns = {m.id: m for m in store.load_conversation(conversation.id).messages}
    assert [turns[m.id].tool.status for m in (waiting, running, done)] == ["stopped", "stopped", "done"]
    assert turns[waiting.id].content == CUT_OFF_CALL and turns[done.id].content == "noon"
