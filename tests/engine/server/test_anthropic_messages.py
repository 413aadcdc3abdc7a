"""``/v1/messages`` with the official ``anthropic`` client: text and its stream on the tiny model, tool use (a
scripted engine writes the call), tool results back to the engine, the key in ``x-api-key``, refusals."""

from __future__ import annotations

import json

import anthropic
import pytest

from engine.api.server.config import ServerConfig
from tests.engine.server.scripted_engine import MODEL

HELLO = [{"role": "user", "content": "The quick brown fox"}]
GREEDY = {"temperature": 0}  # the SDK no longer has a sampling argument; servers such as llama-server read it
WEATHER = {"name": "get_weather", "description": "The weather in a city now.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tiny_client(served_tiny) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served_tiny.root, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def scripted_client(scripted) -> anthropic.Anthropic:
    _, server = scripted
    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=30)


def test_a_text_reply_with_usage(tiny_client, served_tiny) -> None:
    message = tiny_client.messages.create(model=served_tiny.model_id, max_tokens=8, messages=HELLO, extra_body=GREEDY,
                                          system="Be brief.")

    assert message.role == "assistant" and message.type == "message" and message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 8 and message.usage.input_tokens > 3


def test_the_stream_tells_the_same_text_in_anthropic_s_event_order(tiny_client, served_tiny) -> None:
    whole = tiny_client.messages.create(model=served_tiny.model_id, max_tokens=8, messages=HELLO, extra_body=GREEDY)
    with tiny_client.messages.stream(model=served_tiny.model_id, max_tokens=8, messages=HELLO, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()

    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    core = [kind for kind in kinds if kind not in ("text",)]  # the SDK adds "text" events of its own
    assert core[:2] == ["message_start", "content_block_start"]
    assert core[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(core[2:-3]) == {"content_block_delta"}


def test_a_stop_sequence_is_reported(tiny_client, served_tiny) -> None:
    whole = tiny_client.messages.create(model=served_tiny.model_id, max_tokens=12, messages=HELLO, extra_body=GREEDY)
    text = whole.content[0].text
    if len(text.strip()) < 2:
        pytest.skip("the tiny model's reply is too short to stop inside")
    stop = text.strip()[1]
    stopped = tiny_client.messages.create(model=served_tiny.model_id, max_tokens=12, messages=HELLO, extra_body=GREEDY,
                                          stop_sequences=[stop])

    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stop not in stopped.content[0].text if stopped.content else True


def test_a_tool_call_is_a_tool_use_block(scripted_client, scripted) -> None:
    hub, _ = scripted
    hub.script("I will look.\n" + CALL)
    message = scripted_client.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER],
                                              messages=[{"role": "user", "content": "Weather in Paris?"}])

    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "I will look."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("toolu_")
    assert json.loads(hub.requests[-1].tools[0])["function"]["parameters"] == WEATHER["input_schema"]


def test_a_streamed_tool_call_arrives_as_input_json_deltas(scripted_client, scripted) -> None:
    hub, _ = scripted
    hub.script(CALL)
    with scripted_client.messages.stream(model=MODEL, max_tokens=64, tools=[WEATHER],
                                         messages=[{"role": "user", "content": "Weather in Paris?"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()

    deltas = [event.delta.type for event in events if event.type == "content_block_delta"]
    assert deltas == ["input_json_delta"]
    assert [block.type for block in final.content] == ["tool_use"]
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_under_any_the_input_streams_as_the_model_writes_it(scripted_client, scripted) -> None:
    hub, _ = scripted
    hub.script('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Saint-Rémy-de-Provence"}}\n</tool_call>')
    with scripted_client.messages.stream(model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                                         messages=[{"role": "user", "content": "Weather in Paris?"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()

    fragments = [event.delta.partial_json for event in events if event.type == "content_block_delta"]
    assert len(fragments) > 3
    assert [event.type for event in events if event.type.startswith("content_block_s")] == [
        "content_block_start", "content_block_stop"]
    assert final.content[0].input == {"city": "Saint-Rémy-de-Provence"} and final.stop_reason == "tool_use"


def test_any_and_a_named_tool_send_a_grammar(scripted_client, scripted) -> None:
    hub, _ = scripted
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        hub.script(CALL)
        scripted_client.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice=choice,
                                        messages=[{"role": "user", "content": "Weather?"}])
        assert hub.requests[-1].constraint.kind == "grammar"


def test_tool_results_go_back_as_tool_turns(scripted_client, scripted) -> None:
    hub, _ = scripted
    hub.script("21 °C and sunny.")
    message = scripted_client.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 °C, sun"},
                                     {"type": "text", "text": "And tomorrow?"}]},
    ])

    assert message.content[0].text == "21 °C and sunny." and message.stop_reason == "end_turn"
    _, assistant, result, user = hub.requests[-1].messages
    assert assistant.tool_calls[0].name == "get_weather" and json.loads(assistant.tool_calls[0].arguments) == {"city": "Paris"}
    assert (result.role, result.tool_call_id, result.name, result.content) == ("tool", "toolu_1", "get_weather", "21 °C, sun")
    assert (user.role, user.content) == ("user", "And tomorrow?")


@pytest.mark.parametrize("fields", [
    {"max_tokens": 0},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"tool_choice": {"type": "tool", "name": "get_stock"}, "tools": [WEATHER]},
    {"messages": [{"role": "system", "content": "hi"}]},
])
def test_bad_requests_are_anthropic_400s(scripted_client, fields) -> None:
    request = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(anthropic.BadRequestError) as refused:
        scripted_client.messages.create(**request)
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_the_key_may_come_in_x_api_key(served_tiny) -> None:
    keyed = served_tiny.start_another(ServerConfig(port=0, api_key="sekret"))
    try:
        root = keyed.url.removesuffix("/v1")
        good = anthropic.Anthropic(base_url=root, api_key="sekret", max_retries=0, timeout=120)
        bad = anthropic.Anthropic(base_url=root, api_key="wrong", max_retries=0, timeout=120)
        reply = good.messages.create(model=served_tiny.model_id, max_tokens=2, messages=HELLO)
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model=served_tiny.model_id, max_tokens=2, messages=HELLO)
    finally:
        keyed.stop()
    assert reply.usage.output_tokens >= 1
