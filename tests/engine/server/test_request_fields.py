"""Every field Hearth does not do, or that is malformed, anywhere in a body, is a 400 that names it: ``param`` in
OpenAI's error shape, the start of the message in Anthropic's (the scripted engine: no model runs); harmless fields
are accepted."""

from __future__ import annotations

import pytest

from tests.engine.server.scripted_engine import MODEL
from tests.engine.server.test_errors import call

USER = {"role": "user", "content": "Weather in Paris?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "21 °C"}
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
LOOKAROUND = {"type": "function", "function": {"name": "find", "parameters": {
    "type": "object", "properties": {"word": {"type": "string", "pattern": "(?<=a)b"}}}}}  # no grammar can follow
UNSUPPORTED, UNKNOWN = "unsupported_parameter", "unknown_parameter"


def with_call(**changes) -> list[dict]:
    return [USER, {**CALLED, "tool_calls": [{**CALLED["tool_calls"][0], **changes}]}, RESULT]


CHAT_ROWS = [
    ({"n": 2}, "n", UNSUPPORTED),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", UNSUPPORTED),
    ({"modalities": ["text", "audio"]}, "modalities", UNSUPPORTED),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", UNSUPPORTED),
    ({"web_search_options": {}}, "web_search_options", UNSUPPORTED),
    ({"reasoning_effort": "low"}, "reasoning_effort", UNSUPPORTED),
    ({"verbosity": "low"}, "verbosity", UNSUPPORTED),
    ({"logit_bias": {"50256": -100}}, "logit_bias", UNSUPPORTED),
    ({"frequency_penalty": 0.5}, "frequency_penalty", UNSUPPORTED),
    ({"functions": [{"name": "f"}]}, "functions", UNSUPPORTED),
    ({"function_call": {"name": "f"}}, "function_call", UNSUPPORTED),
    ({"top_k": -1}, "top_k", None),
    ({"min_p": 1.5}, "min_p", None),
    ({"repetition_penalty": 0}, "repetition_penalty", None),
    ({"best_of": 2}, "best_of", UNKNOWN),
    ({"user": 5}, "user", None),
    ({"metadata": {"a": 1}}, "metadata", None),
    ({"store": "yes"}, "store", None),
    ({"temperature": -1}, "temperature", None),
    ({"top_p": 2}, "top_p", None),
    ({"max_tokens": "5"}, "max_tokens", None),
    ({"seed": 1.5}, "seed", None),
    ({"stop": 5}, "stop", None),
    ({"top_logprobs": 3}, "top_logprobs", None),
    ({"logprobs": True, "top_logprobs": 30}, "top_logprobs", None),
    ({"stream_options": {"include_usage": True}}, "stream_options", None),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", None),
    ({"stream": True, "stream_options": {"continuous": True}}, "stream_options.continuous", UNKNOWN),
    ({"response_format": {"type": "json_object", "strict": True}}, "response_format.strict", None),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name", None),
    ({"messages": [{**USER, "role": "function"}]}, "messages[0].role", None),
    ({"messages": [{**USER, "mood": "calm"}]}, "messages[0].mood", UNKNOWN),
    ({"messages": [{**USER, "name": 5}]}, "messages[0].name", None),
    ({"messages": [{**USER, "content": [{"type": "text", "text": "hi", "lang": "en"}]}]}, "messages[0].content[0].lang",
     UNKNOWN),
    ({"messages": [{**USER, "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text", None),
    ({"messages": [{**USER, "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages[0].content", None),
    ({"messages": [USER, {**CALLED, "audio": {"id": "a"}}, RESULT]}, "messages[1].audio", UNSUPPORTED),
    ({"messages": with_call(type="custom")}, "messages[1].tool_calls[0].type", None),
    ({"messages": with_call(id=7)}, "messages[1].tool_calls[0].id", None),
    ({"messages": with_call(function={"name": "get_weather", "arguments": {"city": "Paris"}})},
     "messages[1].tool_calls[0].function.arguments", None),
    ({"messages": with_call(function={"name": "get_weather", "arguments": "{}", "strict": True})},
     "messages[1].tool_calls[0].function.strict", UNKNOWN),
    ({"messages": [USER, CALLED, {**RESULT, "name": 5}]}, "messages[2].name", None),
    ({"tools": [{**WEATHER, "cache": True}]}, "tools[0].cache", UNKNOWN),
    ({"tools": [{"type": "function", "function": {**WEATHER["function"], "name": "get weather"}}]},
     "tools[0].function.name", None),
    ({"tools": [{"type": "function", "function": {**WEATHER["function"], "parameters": "city"}}]},
     "tools[0].function.parameters", None),
    ({"tools": [{"type": "function", "function": {**WEATHER["function"], "strict": "yes"}}]},
     "tools[0].function.strict", None),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather", "why": "x"}}},
     "tool_choice.function.why", UNKNOWN),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", None),
    ({"tools": [WEATHER, LOOKAROUND], "tool_choice": "required"}, "tools[1]", None),
]


@pytest.mark.parametrize("fields, param, code", CHAT_ROWS)
def test_chat_fields_are_refused_by_name(scripted, fields, param, code) -> None:
    _, server = scripted
    status, body, _ = call(server.url.removesuffix("/v1"), "POST", "/v1/chat/completions",
                           {"model": MODEL, "messages": [USER], **fields})

    assert status == 400
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)


@pytest.mark.parametrize("fields, param, code", [
    ({"echo": True}, "echo", UNSUPPORTED),
    ({"suffix": "end"}, "suffix", UNSUPPORTED),
    ({"best_of": 2}, "best_of", UNSUPPORTED),
    ({"presence_penalty": 1}, "presence_penalty", UNSUPPORTED),
    ({"logprobs": 30}, "logprobs", None),
    ({"prompt": 5}, "prompt", None),
    ({"messages": [USER]}, "messages", UNKNOWN),
    ({"user": ["me"]}, "user", None),
])
def test_completion_fields_are_refused_by_name(scripted, fields, param, code) -> None:
    _, server = scripted
    status, body, _ = call(server.url.removesuffix("/v1"), "POST", "/v1/completions",
                           {"model": MODEL, "prompt": "Once", **fields})

    assert status == 400
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)


TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}


def result(**changes) -> list[dict]:
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 °C", **changes}
    return [USER, TOOL_USE, {"role": "user", "content": [block]}]


@pytest.mark.parametrize("fields, param", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"container": "container_1"}, "container"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"metadata": "me"}, "metadata"),
    ({"max_tokens": None}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"system": 5}, "system"),
    ({"system": [{"type": "text", "text": "Be brief.", "lang": "en"}]}, "system[0].lang"),
    ({"messages": [{**USER, "role": "system"}]}, "messages[0].role"),
    ({"messages": [{**USER, "id": "m1"}]}, "messages[0].id"),
    ({"messages": [{**USER, "content": [{"type": "text", "text": "hi", "lang": "en"}]}]}, "messages[0].content[0].lang"),
    ({"messages": [{**USER, "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": result(is_error="yes")}, "messages[2].content[0].is_error"),
    ({"messages": [USER, {**TOOL_USE, "content": [{**TOOL_USE["content"][0], "input": "x"}]}]},
     "messages[1].content[0].input"),
    ({"tools": [{**TOOL, "type": "web_search_20250305"}]}, "tools[0]"),
    ({"tools": [{**TOOL, "input_schema": "city"}]}, "tools[0].input_schema"),
    ({"tools": [{**TOOL, "name": "get weather"}]}, "tools[0].name"),
    ({"tools": [{**TOOL, "strict": True}]}, "tools[0].strict"),
    ({"tools": [TOOL], "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tools": [TOOL], "tool_choice": {"type": "auto", "why": "x"}}, "tool_choice.why"),
])
def test_message_fields_are_refused_by_name(scripted, fields, param) -> None:
    _, server = scripted
    status, body, _ = call(server.url.removesuffix("/v1"), "POST", "/v1/messages",
                           {"model": MODEL, "max_tokens": 16, "messages": [USER], **fields})

    assert status == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}: ")


def test_fields_that_change_nothing_are_accepted(scripted) -> None:
    hub, server = scripted
    root = server.url.removesuffix("/v1")
    harmless = {"user": "me", "metadata": {"app": "test"}, "store": False, "service_tier": "auto",
                "prompt_cache_key": "k", "safety_identifier": "s", "modalities": ["text"], "n": 1, "logit_bias": {},
                "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}
    hub.script("Sunny.")
    chat = call(root, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [USER, {**CALLED, "refusal": None, "name": "bot"}, RESULT], **harmless,
        "tools": [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]})
    hub.script("Sunny.")
    cached = {"type": "ephemeral"}
    messages = call(root, "POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 16, "metadata": {"user_id": "me"}, "service_tier": "auto",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": cached}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": cached}]}],
        "tools": [{**TOOL, "cache_control": cached}], "thinking": {"type": "disabled"}})

    assert chat[0] == 200 and "Sunny" in chat[1] and chat[1].endswith("data: [DONE]\n\n")
    assert messages[0] == 200 and messages[1]["content"][0]["text"] == "Sunny."


def test_llama_servers_sampling_extras_reach_the_sampler(scripted) -> None:
    """``top_k``, ``min_p`` and ``repetition_penalty``, which llama-server and vLLM take beside OpenAI's fields."""
    hub, server = scripted
    hub.script("Sunny.")
    status, _, _ = call(server.url.removesuffix("/v1"), "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [USER], "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})

    sampling = hub.requests[-1].sampling
    assert status == 200 and (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (40, 0.05, 1.1)
