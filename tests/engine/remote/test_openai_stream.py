"""The OpenAI wire format as other servers write it: SSE framing, chunks, usage and timings, addresses."""

from __future__ import annotations

import pytest

from engine.api.remote.openai_stream import SseDecoder, chat_request, listed_models, parse_chunk, remote_figures
from engine.api.remote.http_stream import RemoteError, normalize_base_url
from engine.protocol.messages import ChatMessage, Constraint, SamplingParams


def test_events_are_framed_by_blank_lines_and_comments_are_skipped():
    decoder = SseDecoder()
    lines = [": keep-alive", "event: message", 'data: {"a":', 'data:1}', "", "data: [DONE]", ""]

    events = [data for data in map(decoder.feed, lines) if data is not None]

    assert events == ['{"a":\n1}', "[DONE]"]


def test_a_final_chunk_without_choices_carries_usage_and_a_null_content_is_no_text():
    chunk = parse_chunk("http://h", '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}')
    empty = parse_chunk("http://h", '{"choices": [{"delta": {"content": null}, "finish_reason": "length"}]}')

    assert (chunk.text, chunk.usage["prompt_tokens"]) == ("", 3)
    assert (empty.text, empty.finish_reason) == ("", "length")


def test_missing_or_odd_server_figures_stay_unknown():
    figures = remote_figures("http://h", "m", {"prompt_tokens": 7, "completion_tokens": True}, {"predicted_per_second": "fast"})

    assert (figures.prompt_tokens, figures.completion_tokens, figures.cached_tokens, figures.decode_tok_s) == (7, None, None, None)


def test_a_vllm_style_error_object_is_reported():
    with pytest.raises(RemoteError, match="stopped the reply with an error: bad request"):
        parse_chunk("http://h", '{"object": "error", "message": "bad request", "code": 400}')


def test_a_listing_without_data_is_refused():
    with pytest.raises(RemoteError, match="without a list of models"):
        listed_models("http://h", {"models": []})


@pytest.mark.parametrize(("typed", "base"), [
    ("localhost:8000", "http://localhost:8000"),
    (" https://gpu.example.org/v1/ ", "https://gpu.example.org"),
    ("http://10.0.0.5:11434/ollama/v1", "http://10.0.0.5:11434/ollama"),
])
def test_addresses_are_normalized(typed, base):
    assert normalize_base_url(typed) == base


@pytest.mark.parametrize(("typed", "message"), [
    ("", "Enter the server's address"),
    ("http://host:99999", "is not a number from 1 to 65535"),
    ("http://", "has no host name"),
])
def test_bad_addresses_say_what_is_wrong(typed, message):
    with pytest.raises(ValueError, match=message):
        normalize_base_url(typed)


def test_a_json_reply_format_is_asked_of_a_remote_server_as_response_format():
    messages = (ChatMessage("user", "hi"),)
    schema = chat_request("m", messages, SamplingParams(), Constraint("json_schema", '{"type": "object"}'))
    json_object = chat_request("m", messages, SamplingParams(), Constraint("json_object", ""))

    assert schema["response_format"] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": {"type": "object"}}}
    assert json_object["response_format"] == {"type": "json_object"}
    assert "response_format" not in chat_request("m", messages, SamplingParams())
