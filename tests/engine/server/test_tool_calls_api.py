"""Tool calls through ``/v1/chat/completions`` with the official ``openai`` client: what a model writes (scripted
where the tiny models cannot) comes back as ``tool_calls``, whole and streamed as OpenAI streams them, and a
malformed call as text; the request's tools reach the engine, with a grammar for ``required`` and a named tool."""

from __future__ import annotations

import json

import openai
import pytest

from tests.engine.server.scripted_engine import MODEL, serve_scripted

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris and Oslo?"}]
QWEN_TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def client(scripted) -> openai.OpenAI:
    _, server = scripted
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def ask(client: openai.OpenAI, **fields):
    return client.chat.completions.create(model=MODEL, messages=fields.pop("messages", ASK), tools=[WEATHER, TIME],
                                          **fields)


def arguments_of(calls) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in calls]


def test_parallel_calls_come_back_as_tool_calls(client, scripted) -> None:
    hub, _ = scripted
    hub.script(QWEN_TWO_CALLS)
    reply = ask(client, tool_choice="auto")

    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert arguments_of(message.tool_calls) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert len({call.id for call in message.tool_calls}) == 2
    sent = hub.requests[-1]
    assert [json.loads(tool)["function"]["name"] for tool in sent.tools] == ["get_weather", "get_time"]
    assert sent.constraint is None


def test_streamed_calls_arrive_as_openai_streams_them(client, scripted) -> None:
    hub, _ = scripted
    hub.script("Checking.\n" + QWEN_TWO_CALLS)
    chunks = list(ask(client, stream=True))

    deltas = [chunk.choices[0].delta for chunk in chunks]
    calls = [part for delta in deltas for part in (delta.tool_calls or [])]
    assert "".join(delta.content or "" for delta in deltas) == "Checking."
    assert [(part.index, part.id is not None, part.function.name) for part in calls] == [
        (0, True, "get_weather"), (0, False, None), (1, True, "get_weather"), (1, False, None)]
    assert calls[0].type == "function" and calls[0].function.arguments == ""
    assert json.loads(calls[1].function.arguments) == {"city": "Paris"}
    assert json.loads(calls[3].function.arguments) == {"city": "Oslo"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_client_library_assembles_the_streamed_calls(client, scripted) -> None:
    hub, _ = scripted
    hub.script(QWEN_TWO_CALLS)
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER]) as stream:
        final = stream.get_final_completion()

    assert arguments_of(final.choices[0].message.tool_calls) == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]


def test_under_required_the_arguments_stream_as_the_model_writes_them(client, scripted) -> None:
    hub, _ = scripted
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Saint-Rémy-de-Provence"}}\n</tool_call>'
    hub.script(call)
    hub.script(call)
    chunks = list(ask(client, tool_choice="required", stream=True))
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required") as stream:
        final = stream.get_final_completion()

    parts = [part for chunk in chunks for part in (chunk.choices[0].delta.tool_calls or [])]
    assert parts[0].function.name == "get_weather" and parts[0].function.arguments == ""
    fragments = [part.function.arguments for part in parts[1:]]
    assert len(fragments) > 3 and all(part.index == 0 and part.id is None for part in parts[1:])
    assert json.loads("".join(fragments)) == {"city": "Saint-Rémy-de-Provence"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert arguments_of(final.choices[0].message.tool_calls) == [("get_weather", {"city": "Saint-Rémy-de-Provence"})]


def test_a_required_call_cut_short_ends_with_length(client, scripted) -> None:
    hub, _ = scripted
    hub.script('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Saint-Ré', finish="max_tokens")
    chunks = list(ask(client, tool_choice="required", stream=True))

    parts = [part for chunk in chunks for part in (chunk.choices[0].delta.tool_calls or [])]
    assert "".join(part.function.arguments for part in parts) == '{"city": "Saint-Ré'
    assert not any(chunk.choices[0].delta.content for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_comes_back_as_text_and_the_stream_ends_cleanly(client, scripted, stream) -> None:
    hub, _ = scripted
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    hub.script(broken, finish="max_tokens")
    if stream:
        chunks = list(ask(client, stream=True))
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        assert not any(chunk.choices[0].delta.tool_calls for chunk in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        reply = ask(client)
        text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert reply.choices[0].message.tool_calls is None
    assert text == broken
    assert reason == "length"


def test_with_tool_choice_none_a_call_is_plain_text(client, scripted) -> None:
    hub, _ = scripted
    hub.script(QWEN_TWO_CALLS)
    reply = ask(client, tool_choice="none")

    assert reply.choices[0].message.content == QWEN_TWO_CALLS
    assert reply.choices[0].finish_reason == "stop"


def test_required_and_named_choices_send_a_grammar_of_the_allowed_calls(client, scripted) -> None:
    hub, _ = scripted
    hub.script(QWEN_TWO_CALLS)
    ask(client, tool_choice="required")
    required = hub.requests[-1].constraint
    hub.script(QWEN_TWO_CALLS)
    ask(client, tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    named = hub.requests[-1].constraint

    assert required.kind == "grammar" and "get_weather" in required.spec and "get_time" in required.spec
    assert named.kind == "grammar" and "get_time" in named.spec and "get_weather" not in named.spec


def test_a_tool_result_goes_back_to_the_engine_as_tool_turns(client, scripted) -> None:
    hub, _ = scripted
    hub.script("It is 21 °C in Paris.")
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temperature": 21}'},
    ]
    reply = ask(client, messages=history)

    assert reply.choices[0].message.content == "It is 21 °C in Paris."
    assert reply.choices[0].finish_reason == "stop"
    assistant, result = hub.requests[-1].messages[1:]
    assert assistant.tool_calls[0].id == "call_a" and assistant.tool_calls[0].name == "get_weather"
    assert (result.role, result.tool_call_id, result.content) == ("tool", "call_a", '{"temperature": 21}')


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tool_fields_are_refused_naming_the_field(client, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK, **fields)
    assert refused.value.body["param"] == param


def test_a_tool_turn_without_its_call_id_is_refused(client) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK + [{"role": "tool", "content": "21"}])
    assert refused.value.body["param"] == "messages[1].tool_call_id"


@pytest.mark.parametrize("tool_format, reply", [
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'),
])
def test_each_family_s_calls_are_read_as_its_template_writes_them(tool_format, reply) -> None:
    with serve_scripted(tool_format) as (hub, server):
        family = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        hub.script(reply)
        hub.script(reply)
        whole = ask(family)
        chunks = list(ask(family, stream=True))

        expected = [("get_weather", {"city": "Paris"}), ("get_time", {})]
        assert arguments_of(whole.choices[0].message.tool_calls) == expected
        assert whole.choices[0].finish_reason == "tool_calls"
        parts = [part for chunk in chunks for part in (chunk.choices[0].delta.tool_calls or [])]
        assert [part.function.name for part in parts if part.id] == ["get_weather", "get_time"]
        assert not any(chunk.choices[0].delta.content for chunk in chunks)
