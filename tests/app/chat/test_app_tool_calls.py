"""Tools in a conversation: the model's call gets a card, the user approves or denies it, the result goes
back to the model and the reply goes on; timeouts, unknown tools, Stop and the round limit end cleanly."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.chat import tool_round
from app.chat.reply_router import MAX_TOOL_ROUNDS
from app.chat.tool_card import ToolCard
from app.conversations.conversation import DisplayMessage
from app.conversations.conversation_settings import open_conversation_settings
from app.conversations.export_dialog import export_text
from app.storage.records import ToolTurn
from app.storage.settings import ToolServerConfig
from engine.protocol.messages import ChatMessage

from tests.app.chat.stand_in_hub import StandInHub

QUESTION = "What is the weather in Paris?"
SUNNY = "Sunny, 21 °C in Paris"
ANSWER = ("It", " is", " sunny", " in", " Paris.")


def call_tokens(name: str = "get_weather", city: str = "Paris") -> tuple[str, ...]:
    """A Hermes tool call, streamed in pieces as a model writes it."""
    arguments = json.dumps({"city": city})
    return ("<tool_call>", f'{{"name": "{name}", ', f'"arguments": {arguments}}}', "</tool_call>")


@pytest.fixture
def hub(window) -> StandInHub:
    """A hub whose get_weather tool answers sunny weather, given to the window, with a server turned on in
    Settings › Tools (the hub stands in for it)."""
    stand_in = StandInHub({"get_weather": lambda arguments: SUNNY if arguments.get("city") == "Paris" else "Rain"})
    window.session.replies.tool_hub = stand_in
    window.settings_holder.update(tool_servers=(ToolServerConfig(name="weather", command="weather-server"),))
    return stand_in


def use_tools(chat) -> None:
    """Tick "Use tools" in the conversation's settings and save."""
    chat.wait_until_ready()
    dialog = open_conversation_settings(chat.window)
    assert dialog.use_tools.isEnabled()
    dialog.use_tools.setChecked(True)
    dialog.accept()


def tool_cards(chat) -> list[ToolCard]:
    return [card for card in chat.window.chat_view.bubbles if isinstance(card, ToolCard)]


def ask(chat, text: str = QUESTION) -> None:
    chat.type_and_press_enter(text)


def card_waiting(chat, count: int = 1) -> ToolCard:
    """The ``count``-th card, once it asks for approval."""
    chat.qtbot.waitUntil(lambda: len(tool_cards(chat)) >= count and tool_cards(chat)[count - 1].answer_buttons[0].isVisible(),
                         timeout=5000)
    return tool_cards(chat)[count - 1]


def press(chat, card: ToolCard, answer: str) -> None:
    button = next(button for button in card.answer_buttons if button.objectName() == f"tool_{answer}")
    button.click()


def test_an_approved_call_shows_its_result_and_the_reply_goes_on_after_it(chat, script, hub):
    script.replies_by_prompt = {QUESTION: ("Let me look.",) + call_tokens(), SUNNY: ANSWER}
    streamed: list[str] = []
    chat.window.session.replies.text_changed.connect(lambda reply: streamed.append(reply.message.content))
    use_tools(chat)
    ask(chat)

    card = card_waiting(chat)
    assert "Let get_weather run" in card.question.text()
    assert card.arguments.text() == '{\n  "city": "Paris"\n}'
    assert hub.calls == [] and chat.window.session.generating
    press(chat, card, "allow_once")
    chat.wait_until_reply_ends()

    assert hub.calls == [("get_weather", {"city": "Paris"}, tool_round.TOOL_TIMEOUT_S)]
    assert card.status.text().startswith("Done") and card.result.text() == SUNNY
    assert not card.answer_buttons[0].isVisible()
    first, second = script.generates
    assert [json.loads(text)["function"]["name"] for text in first.tools] == ["get_weather"]
    call = second.messages[-2].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert second.messages[-2:] == (
        ChatMessage("assistant", "Let me look.", tool_calls=(call,)),
        ChatMessage("tool", SUNNY, tool_call_id=call.id, name="get_weather"),
    )
    assert chat.last_reply().content == "".join(ANSWER)
    assert chat.shown_texts()[-1] == "It is sunny in Paris."
    assert "Let me look." in streamed and not any("<tool_call" in text for text in streamed), "calls show as cards"
    assert chat.window.session.conversation.history()[-3:] == second.messages[-2:] + (
        ChatMessage("assistant", "".join(ANSWER)),
    )


def test_a_denied_call_tells_the_model_so_and_nothing_runs(chat, script, hub):
    script.replies_by_prompt = {QUESTION: call_tokens(), tool_round.DENIED: ("Understood.",)}
    use_tools(chat)
    ask(chat)

    press(chat, card_waiting(chat), "deny")
    chat.wait_until_reply_ends()

    assert hub.calls == []
    assert tool_cards(chat)[0].status.text() == "Denied"
    assert script.generates[1].messages[-1] == ChatMessage(
        "tool", tool_round.DENIED, tool_call_id=script.generates[1].messages[-2].tool_calls[0].id, name="get_weather"
    )
    assert chat.last_reply().content == "Understood."


def test_a_call_that_times_out_shows_so_and_the_reply_goes_on(chat, script, hub, monkeypatch):
    monkeypatch.setattr(tool_round, "TOOL_TIMEOUT_S", 0.2)
    hub.behaviours["get_weather"] = "timeout"
    script.replies_by_prompt = {QUESTION: call_tokens(), "The tool did not answer within 0.2 s.": ("Too slow.",)}
    use_tools(chat)
    ask(chat)

    press(chat, card_waiting(chat), "allow_once")
    chat.wait_until_reply_ends()

    card = tool_cards(chat)[0]
    assert card.status.text() == "Timed out  ·  0.20 s" and card.status.property("status") == "timeout"
    assert card.result.text() == "The tool did not answer within 0.2 s."
    assert chat.last_reply().content == "Too slow."


def test_an_error_and_a_tool_that_does_not_exist_get_error_cards_and_the_reply_goes_on(chat, script, hub):
    hub.behaviours["get_weather"] = "error"
    script.replies_by_prompt = {QUESTION: call_tokens("get_wether") + call_tokens()}
    use_tools(chat)
    ask(chat)

    press(chat, card_waiting(chat, 2), "allow_once")
    chat.wait_until_reply_ends()

    unknown, failed = tool_cards(chat)
    assert unknown.status.text() == "Error" and "no tool named “get_wether”" in unknown.result.text()
    assert failed.status.text().startswith("Error") and "503" in failed.result.text()
    assert [m.role for m in script.generates[1].messages[-3:]] == ["assistant", "tool", "tool"]
    assert chat.last_reply().content == script.full_reply


def test_always_allow_skips_the_question_next_time(chat, script, hub):
    script.replies_by_prompt = {QUESTION: call_tokens(), "And in Oslo?": call_tokens(city="Oslo")}
    use_tools(chat)
    ask(chat)
    press(chat, card_waiting(chat), "allow_always")
    chat.wait_until_reply_ends()

    chat.send_and_wait("And in Oslo?")

    assert [name for name, _arguments, _timeout in hub.calls] == ["get_weather", "get_weather"]
    second = tool_cards(chat)[1]
    assert second.status.text().startswith("Done") and second.result.text() == "Rain"
    assert hub.always == {"get_weather"}


@pytest.mark.parametrize("behaviour", ["ask", "hang"])
def test_stop_while_a_call_waits_or_runs_ends_the_reply_cleanly(chat, script, hub, behaviour):
    hub.behaviours["get_weather"] = "hang"
    script.replies_by_prompt = {QUESTION: call_tokens() + call_tokens(city="Rome")}
    use_tools(chat)
    ask(chat)
    card = card_waiting(chat)
    if behaviour == "hang":
        press(chat, card, "allow_once")
        chat.qtbot.waitUntil(lambda: card.status.text() == "Running…", timeout=5000)

    chat.window.input_bar.stop_button.click()
    chat.wait_until_reply_ends()

    assert [c.status.text() for c in tool_cards(chat)] == ["Stopped", "Stopped"]
    assert hub.cancelled == (["get_weather"] if behaviour == "hang" else [])
    assert len(script.generates) == 1
    chat.send_and_wait("Never mind")
    assert [m.role for m in script.generates[1].messages] == ["user", "assistant", "tool", "tool", "user"]


def test_a_reply_that_keeps_calling_tools_stops_at_the_limit_with_a_note(chat, script, hub):
    script.reply_tokens = call_tokens()
    hub.always.add("get_weather")
    use_tools(chat)
    ask(chat)
    chat.qtbot.waitUntil(lambda: not chat.window.session.generating, timeout=20000)

    assert len(script.generates) == MAX_TOOL_ROUNDS + 1
    assert len(hub.calls) == MAX_TOOL_ROUNDS
    last = tool_cards(chat)[-1]
    assert last.status.text() == "Not run" and f"limit of {MAX_TOOL_ROUNDS} rounds" in last.result.text()
    assert f"after {MAX_TOOL_ROUNDS} rounds" in chat.window.status_line.currentMessage()


def test_tool_cards_survive_a_restart_and_are_exported(chat, script, hub, reopen):
    script.replies_by_prompt = {QUESTION: call_tokens(), SUNNY: ANSWER}
    use_tools(chat)
    ask(chat)
    press(chat, card_waiting(chat), "allow_once")
    chat.wait_until_reply_ends()
    conversation_id = chat.window.session.conversation.id

    again = reopen()

    conversation = again.session.conversation
    assert conversation.use_tools
    assert [m.role for m in conversation.messages] == ["user", "assistant", "tool", "assistant"]
    assert conversation.history() == script.generates[1].messages + (ChatMessage("assistant", "".join(ANSWER)),)
    chat.qtbot.waitUntil(lambda: not again.chat_view.loading, timeout=5000)
    card = next(card for card in again.chat_view.bubbles if isinstance(card, ToolCard))
    assert card.result.text() == SUNNY and card.status.text().startswith("Done")
    markdown = export_text(again.journal.store, conversation_id, as_json=False)
    assert "## Tool: get_weather" in markdown and SUNNY in markdown and '"city": "Paris"' in markdown
    document = json.loads(export_text(again.journal.store, conversation_id, as_json=True))
    assert document["messages"][1]["tool_calls"][0]["name"] == "get_weather"
    assert document["messages"][2]["tool"]["status"] == "done" and document["messages"][2]["content"] == SUNNY


def test_a_call_cut_off_by_the_end_of_hearth_shows_as_stopped(chat, script, hub, reopen):
    script.replies_by_prompt = {QUESTION: call_tokens()}
    use_tools(chat)
    ask(chat)
    card_waiting(chat)

    again = reopen()
    chat.window.input_bar.stop_button.click()

    tool = again.session.conversation.messages[-1]
    assert tool.tool.status == "stopped" and "Hearth stopped" in tool.content


def test_the_reply_format_and_use_tools_survive_a_restart(chat, reopen):
    chat.wait_until_ready()
    dialog = open_conversation_settings(chat.window)
    dialog.reply_kind.setCurrentIndex(dialog.reply_kind.findData("json_schema"))
    dialog.schema.setPlainText('{"type": "object"}')
    dialog.accept()

    again = reopen().session.conversation

    assert (again.reply_format.kind, again.reply_format.schema) == ("json_schema", '{"type": "object"}')
    assert not again.use_tools


def test_tools_need_free_text_replies_and_a_hub(chat, window):
    chat.wait_until_ready()
    dialog = open_conversation_settings(window)
    assert not dialog.use_tools.isEnabled() and "Settings › Tools" in dialog.use_tools.toolTip()
    dialog.reject()
    window.session.replies.tool_hub = StandInHub({})
    dialog = open_conversation_settings(window)
    dialog.reply_kind.setCurrentIndex(dialog.reply_kind.findData("json"))
    dialog.use_tools.setChecked(True)
    dialog.accept()

    assert dialog.isVisible() and "Tools need free-text replies" in dialog.error_label.text()
    assert not window.session.conversation.use_tools


def test_a_call_is_approved_and_answered_under_the_apps_own_loop(real_app, script):
    script.replies_by_prompt = {QUESTION: call_tokens(), SUNNY: ANSWER}
    hub = StandInHub({"get_weather": lambda _arguments: SUNNY})

    async def scenario(window) -> None:
        window.session.replies.tool_hub = hub
        await real_app.until(window.input_bar.send_button.isEnabled)
        dialog = open_conversation_settings(window)
        dialog.use_tools.setChecked(True)
        dialog.accept()
        window.session.send(QUESTION)
        cards = lambda: [card for card in window.chat_view.bubbles if isinstance(card, ToolCard)]  # noqa: E731
        await real_app.until(lambda: cards() and cards()[0].answer_buttons[0].isVisible())
        cards()[0].answer_buttons[0].click()
        await real_app.until(lambda: not window.session.generating)

        assert cards()[0].result.text() == SUNNY
        assert window.session.conversation.messages[-1].content == "".join(ANSWER)
        assert [m.role for m in script.generates[-1].messages] == ["user", "assistant", "tool"]

    real_app.run(scenario)


def test_the_answer_buttons_stand_one_above_the_other_in_a_narrow_card(chat_view, qtbot):
    message = DisplayMessage("tool", "", tool=ToolTurn("call_1", "get_weather", '{"city": "Paris"}'))
    buttons = chat_view.add_message(message).answer_buttons
    qtbot.waitUntil(lambda: buttons[0].isVisible() and buttons[0].y() == buttons[2].y(), timeout=2000)

    chat_view.resize(300, 400)

    qtbot.waitUntil(lambda: buttons[0].y() < buttons[1].y() < buttons[2].y(), timeout=2000)
    assert all(button.width() >= button.sizeHint().width() for button in buttons), "no label is cut off"


def test_a_call_waits_while_the_user_reads_another_conversation_and_is_answered_on_return(chat, script, hub):
    script.replies_by_prompt = {QUESTION: call_tokens(), SUNNY: ANSWER}
    use_tools(chat)
    ask(chat)
    card_waiting(chat)
    asking = chat.window.session.conversation.id

    chat.window.conversations.new_conversation()
    assert tool_cards(chat) == [] and chat.sidebar_titles() == [QUESTION]
    chat.window.conversations.open(asking)

    press(chat, card_waiting(chat), "allow_once")
    chat.wait_until_reply_ends()
    assert tool_cards(chat)[0].result.text() == SUNNY
    assert chat.last_reply().content == "".join(ANSWER)


def test_the_reply_says_it_waits_for_the_tool_servers_until_they_list_their_tools(chat, script, hub):
    """Servers starting up can take long to list their tools: the reply says so, not that it waits for its turn."""
    script.replies_by_prompt = {QUESTION: ANSWER}
    hub.listed = asyncio.Event()
    use_tools(chat)
    ask(chat)
    reply_bubble = chat.window.chat_view.bubbles[-1]
    chat.qtbot.wait(100)
    assert reply_bubble.note.text() == "asking the tool servers for their tools…"

    hub.listed.set()
    chat.wait_until_reply_ends()
    assert reply_bubble.message.content == "".join(ANSWER) and reply_bubble.note.text() == ""


def test_deleting_a_reply_that_called_a_tool_deletes_its_card_too(chat, script, hub, reopen):
    script.replies_by_prompt = {QUESTION: ("Let me look.",) + call_tokens(), SUNNY: ANSWER}
    use_tools(chat)
    ask(chat)
    press(chat, card_waiting(chat), "allow_once")
    chat.wait_until_reply_ends()
    calling_reply = chat.window.session.conversation.messages[1]
    assert calling_reply.tool_calls

    chat.window.session.delete(calling_reply)

    assert [m.role for m in chat.window.session.conversation.messages] == ["user", "assistant"]
    assert tool_cards(chat) == []
    again = reopen()
    assert [m.role for m in again.session.conversation.messages] == ["user", "assistant"]
    assert all(message.role != "tool" for message in again.session.conversation.history())
