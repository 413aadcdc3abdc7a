"""Tool calls read out of recorded replies of each family, whole and streamed a few characters at a time."""

from __future__ import annotations

import json

import pytest

from engine.chat.tool_calls import CallArguments, CallStart, ToolCallParser, split_reply
from engine.chat.tool_formats import detect_tool_format
from engine.protocol.messages import ToolCall

QWEN_TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)
QWEN_TEXT_THEN_CALL = (
    "Let me look that up.\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō"}}\n</tool_call>'
)
LLAMA_PLAIN = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA_TAGGED = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
MISTRAL_LIST = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
MISTRAL_ARGS = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'


def streamed(tool_format: str, text: str, step: int = 3, stream_arguments: bool = False) -> tuple[list, ToolCallParser]:
    parser = ToolCallParser(tool_format, stream_arguments=stream_arguments)
    pieces = []
    for start in range(0, len(text), step):
        pieces += parser.feed(text[start:start + step])
    return pieces + parser.finish(), parser


def names_and_arguments(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize("tool_format, reply, expected", [
    ("hermes", QWEN_TWO_CALLS, [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_weather", {"city": "Oslo"})]),
    ("llama3", LLAMA_PLAIN, [("get_weather", {"city": "Paris"})]),
    ("llama3", LLAMA_TAGGED, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ("mistral", MISTRAL_LIST, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ("mistral", MISTRAL_ARGS, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
])
def test_each_family_s_calls_are_read_whole_and_streamed(tool_format, reply, expected) -> None:
    content, calls, malformed = split_reply(tool_format, reply)
    pieces, parser = streamed(tool_format, reply)

    assert names_and_arguments(calls) == expected
    assert names_and_arguments(parser.calls) == expected
    assert content == "" and not malformed
    assert not any(isinstance(piece, str) for piece in pieces)
    assert [piece.id for piece in pieces if isinstance(piece, CallStart)] == [call.id for call in parser.calls]
    assert len({call.id for call in calls}) == len(calls) and all(call.id.startswith("call_") for call in calls)


def test_text_before_a_call_streams_as_text_and_the_blank_lines_go() -> None:
    pieces, parser = streamed("hermes", QWEN_TEXT_THEN_CALL)

    text = "".join(piece for piece in pieces if isinstance(piece, str))
    assert text == "Let me look that up."
    assert names_and_arguments(parser.calls) == [("get_weather", {"city": "Tōkyō"})]
    assert isinstance(pieces[-1], ToolCall)


def test_plain_text_streams_unchanged_and_a_partial_marker_is_held_only_while_it_could_open_a_call() -> None:
    parser = ToolCallParser("hermes")
    assert parser.feed("Use <tool") == ["Use"]
    assert parser.feed("box> now") == [" <toolbox> now"]
    assert parser.finish() == []
    assert parser.calls == [] and not parser.malformed


@pytest.mark.parametrize("tool_format, reply", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off by max_tokens
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>'),  # a brace missing
    ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'),  # no name
    ("llama3", '{"name": "get_weather", "parameters": {"city": '),
    ("llama3", '{"name": "get_weather", "parameters": "Paris"}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Paris"}'),
])
def test_a_malformed_or_truncated_call_comes_back_as_the_text_the_model_wrote(tool_format, reply) -> None:
    content, calls, malformed = split_reply(tool_format, reply)
    pieces, parser = streamed(tool_format, reply)

    assert calls == [] and parser.calls == []
    assert malformed and parser.malformed
    assert content == reply
    assert "".join(pieces) == reply


def test_a_good_call_after_a_malformed_one_is_still_a_call() -> None:
    reply = '<tool_call>{"name": oops}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    content, calls, malformed = split_reply("hermes", reply)

    assert content == '<tool_call>{"name": oops}</tool_call>'
    assert names_and_arguments(calls) == [("get_time", {})]
    assert malformed


def test_a_llama_reply_that_is_plain_text_is_text() -> None:
    assert split_reply("llama3", "Paris is sunny today.") == ("Paris is sunny today.", [], False)


def test_without_parallel_calls_only_the_first_call_is_kept() -> None:
    _, calls, _ = split_reply("hermes", QWEN_TWO_CALLS, parallel=False)
    assert names_and_arguments(calls) == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_arguments_given_as_json_text_are_read_as_the_object() -> None:
    reply = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>'
    assert names_and_arguments(split_reply("hermes", reply)[1]) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("template, family", [
    ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>", "hermes"),
    ("{{- '<|python_tag|>' }}{% if message.role == 'ipython' %}", "llama3"),
    ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("{% for message in messages %}{{ message.content }}{% endfor %}", "hermes"),
    (None, "hermes"),
])
def test_the_family_comes_from_the_chat_template(template, family) -> None:
    assert detect_tool_format(template) == family


@pytest.mark.parametrize("tool_format, reply", [
    ("hermes", QWEN_TWO_CALLS), ("llama3", LLAMA_TAGGED), ("mistral", MISTRAL_LIST),
])
def test_under_the_grammar_arguments_stream_as_they_are_written(tool_format, reply) -> None:
    pieces, parser = streamed(tool_format, reply, stream_arguments=True)

    starts = [piece for piece in pieces if isinstance(piece, CallStart)]
    assert [start.id for start in starts] == [call.id for call in parser.calls]
    for start, call in zip(starts, parser.calls):
        fragments = [piece.text for piece in pieces if isinstance(piece, CallArguments) and piece.index == start.index]
        assert len(fragments) > 2 or call.arguments == "{}"
        assert json.loads("".join(fragments)) == json.loads(call.arguments)
        assert pieces.index(start) < pieces.index(call)  # the start went out before the call was whole


def test_a_streamed_call_cut_short_stays_a_partial_call_not_text() -> None:
    pieces, parser = streamed("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris', 4,
                              stream_arguments=True)

    assert "".join(piece.text for piece in pieces if isinstance(piece, CallArguments)) == '{"city": "Pa\\"ris'
    assert not any(isinstance(piece, str) for piece in pieces)
    assert parser.calls == [] and parser.malformed
