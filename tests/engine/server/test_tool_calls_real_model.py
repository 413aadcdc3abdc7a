"""Tool calls end to end on the built-in SmolLM2-135M-Instruct: its template knows no tools, so Hearth describes
them in Hermes' form, and with ``tool_choice: required`` (or a named function) the grammar makes its reply a call
of an offered function, which comes back as ``tool_calls``, whole and streamed (SmolLM2 would not write the call
by itself). A tool result fed back gets a text answer."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from engine.chat.tool_grammar import MAX_CALLS

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False},
}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def client(served_default) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_default.url, api_key="unused", max_retries=0, timeout=300)


def test_required_makes_the_real_model_call_a_tool(client, served_default) -> None:
    reply = client.chat.completions.create(model=served_default.model_id, messages=ASK, tools=[WEATHER, TIME],
                                           tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_tokens=80)

    assert reply.choices[0].finish_reason == "tool_calls"
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_required_parallel_calls_end_with_tool_calls(client, served_default) -> None:
    reply = client.chat.completions.create(model=served_default.model_id, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=True, temperature=1, seed=1,
                                           max_tokens=300)  # room for the grammar's most calls of this bounded tool

    assert reply.choices[0].finish_reason == "tool_calls"
    calls = reply.choices[0].message.tool_calls
    assert 1 <= len(calls) <= MAX_CALLS
    assert all(isinstance(json.loads(call.function.arguments)["city"], str) for call in calls)


def test_a_named_function_is_the_one_called_and_streams_as_openai_streams(client, served_default) -> None:
    chunks = list(client.chat.completions.create(
        model=served_default.model_id, messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=80, stream=True,
    ))

    parts = [part for chunk in chunks for part in (chunk.choices[0].delta.tool_calls or [])]
    assert parts[0].function.name == "get_weather" and parts[0].id
    arguments = json.loads("".join(part.function.arguments or "" for part in parts))
    assert isinstance(arguments["city"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_result_fed_back_gets_a_text_answer(client, served_default) -> None:
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21, "sky": "sunny"}'},
    ]
    reply = client.chat.completions.create(model=served_default.model_id, messages=history, tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=30)

    assert reply.choices[0].message.content
    assert reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > 60  # the tool description, the call and its result reached the prompt


def test_anthropic_s_any_choice_makes_the_real_model_use_a_tool(served_default) -> None:
    client = anthropic.Anthropic(base_url=served_default.root, api_key="unused", max_retries=0, timeout=300)
    weather = WEATHER["function"]
    message = client.messages.create(
        model=served_default.model_id, max_tokens=80, messages=ASK,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        tools=[{"name": weather["name"], "description": weather["description"], "input_schema": weather["parameters"]}],
        extra_body={"temperature": 0},
    )

    assert message.stop_reason == "tool_use"
    [use] = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)


def test_a_streamed_call_carries_the_same_logprobs_as_the_whole_reply(client, served_default) -> None:
    ask = dict(model=served_default.model_id, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
               parallel_tool_calls=False, max_tokens=80, logprobs=True)
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True))

    streamed = [entry.token for chunk in chunks if chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs.content]
    assert whole.choices[0].message.tool_calls
    assert streamed == [entry.token for entry in whole.choices[0].logprobs.content]
