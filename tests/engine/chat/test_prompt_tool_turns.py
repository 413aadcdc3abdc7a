"""Dropping the oldest turns of a chat with tool calls: a call's result goes with the turn that asked for it."""

from __future__ import annotations

from engine.chat.prompt import plan_prompt
from engine.protocol.messages import ChatMessage, ToolCall

CHAT = (
    ChatMessage("system", "be brief"),
    ChatMessage("user", "weather in paris"),
    ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    ChatMessage("tool", "21 degrees", tool_call_id="call_1", name="get_weather"),
    ChatMessage("assistant", "it is 21 degrees"),
    ChatMessage("user", "and in oslo"),
)


def render(messages) -> str:
    return " ".join(f"{m.role} {m.content} {' '.join(c.arguments for c in m.tool_calls)}" for m in messages)


def words(text: str) -> list[int]:
    return [0] * len(text.split())


def test_an_old_tool_call_and_its_result_are_dropped_with_the_question() -> None:
    whole = len(words(render(CHAT)))
    plan = plan_prompt(CHAT, render, words, context_length=whole + 4, budget=5, policy="drop_oldest")

    assert plan.dropped_turns == (1, 2, 3, 4)
    assert len(plan.token_ids) == len(words(render((CHAT[0], CHAT[5]))))
