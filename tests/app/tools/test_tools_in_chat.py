"""An MCP round trip in the window: the window's own hub runs the test server's tools from a chat.

The engine is the fake one (its reply is a Hermes tool call); the hub, the MCP SDK and the
server process (``mcp_test_server.py``) are real, as Settings › Tools sets them up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.chat import tool_round
from app.chat.tool_card import ToolCard
from app.conversations.conversation_settings import open_conversation_settings
from tests.app.tools.conftest import is_running, server_config, started_pids

QUESTION = "What is 2 + 3?"
SERVER_WAIT_MS = 60_000  # the SDK's first import and the server's start, on a busy machine


def call_tokens(name: str, arguments: dict) -> tuple[str, ...]:
    return ("<tool_call>", json.dumps({"name": name, "arguments": arguments}), "</tool_call>")


@pytest.fixture
def tools_chat(chat, window, pid_file: Path, run):
    """The chat, with the test server turned on in Settings › Tools and "Use tools" ticked; the hub is closed after."""
    window.settings_holder.update(tool_servers=(server_config("numbers", pid_file),))
    chat.wait_until_ready()
    dialog = open_conversation_settings(window)
    assert dialog.use_tools.isEnabled()
    dialog.use_tools.setChecked(True)
    dialog.accept()
    yield chat
    run(window.tool_hub.close())
    assert not any(is_running(pid) for pid in started_pids(pid_file))


def card_waiting(chat) -> ToolCard:
    def waiting() -> bool:
        cards = [card for card in chat.window.chat_view.bubbles if isinstance(card, ToolCard)]
        return bool(cards) and cards[-1].answer_buttons[0].isVisible()

    chat.qtbot.waitUntil(waiting, timeout=SERVER_WAIT_MS)
    return [card for card in chat.window.chat_view.bubbles if isinstance(card, ToolCard)][-1]


def wait_until_reply_ends(chat) -> None:
    chat.qtbot.waitUntil(lambda: not chat.window.session.generating, timeout=SERVER_WAIT_MS)


def press(card: ToolCard, answer: str) -> None:
    next(button for button in card.answer_buttons if button.objectName() == f"tool_{answer}").click()


def test_an_approved_call_runs_on_the_server_and_the_reply_uses_its_result(tools_chat, script):
    script.replies_by_prompt = {QUESTION: call_tokens("add", {"a": 2, "b": 3}), "5": ("It", " is", " 5.")}
    tools_chat.type_and_press_enter(QUESTION)

    card = card_waiting(tools_chat)
    press(card, "allow_once")
    wait_until_reply_ends(tools_chat)

    assert card.status.text().startswith("Done") and card.result.text() == "5"
    offered = [json.loads(text)["function"]["name"] for text in script.generates[0].tools]
    assert {"add", "fail", "sleep_forever"} <= set(offered)
    assert tools_chat.last_reply().content == "It is 5."


def test_a_denied_call_never_reaches_the_server(tools_chat, script, pid_file: Path):
    script.replies_by_prompt = {QUESTION: call_tokens("crash", {}), tool_round.DENIED: ("Fine.",)}
    tools_chat.type_and_press_enter(QUESTION)

    press(card_waiting(tools_chat), "deny")
    wait_until_reply_ends(tools_chat)

    assert tools_chat.last_reply().content == "Fine."
    assert [is_running(pid) for pid in started_pids(pid_file)] == [True], "the crash tool never ran"


def test_a_hung_server_gives_a_timeout_card_and_the_reply_goes_on(tools_chat, script, monkeypatch):
    monkeypatch.setattr(tool_round, "TOOL_TIMEOUT_S", 2.0)
    script.replies_by_prompt = {QUESTION: call_tokens("sleep_forever", {})}
    script.reply_tokens = ("It", " hung.")  # to the tool turn, whatever the hub's words
    tools_chat.type_and_press_enter(QUESTION)

    card = card_waiting(tools_chat)
    press(card, "allow_once")
    wait_until_reply_ends(tools_chat)

    assert card.status.text().startswith("Timed out") and "within 2 s" in card.result.text()
    assert tools_chat.last_reply().content == "It hung."
