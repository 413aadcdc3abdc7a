"""Hostile or odd requests get OpenAI-shaped 4xx answers, never a 500, a hang, or a silently ignored field."""

from __future__ import annotations

import http.client
import json
import socket
import time
from urllib.parse import urlsplit

import openai
import pytest

from engine.api.server import completions, slow_clients
from engine.protocol.messages import Generate
from tests.engine.server.test_errors import CHAT, assert_openai_error, call, chat


@pytest.fixture(scope="module")
def client(served_tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_tiny.url, api_key="unused", max_retries=0, timeout=120)


def _last_generate(served) -> Generate:
    generates = []
    while not served.hub.submitted.empty():
        request = served.hub.submitted.get_nowait()
        if isinstance(request, Generate):
            generates.append(request)
    return generates[-1]


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force(client, served_tiny) -> None:
    reply = client.chat.completions.create(
        model=served_tiny.model_id, messages=[{"role": "user", "content": "Count"}], max_tokens=3,
        max_completion_tokens=None, temperature=0,
    )

    assert reply.usage.completion_tokens <= 3
    assert _last_generate(served_tiny).sampling.max_new_tokens == 3


def test_a_request_without_max_tokens_gets_the_default_the_model_list_states(served_tiny) -> None:
    listed = call(served_tiny.root, "GET", "/v1/models")[1]["data"][0]
    served_tiny.hub.forget_submitted()

    call(served_tiny.root, "POST", CHAT, {"model": served_tiny.model_id, "messages": [{"role": "user", "content": "x"}],
                                          "stream": True})

    assert listed["max_tokens_default"] == min(2048, listed["max_model_len"] // 2)
    assert _last_generate(served_tiny).sampling.max_new_tokens == listed["max_tokens_default"]


def test_the_serve_commands_default_name_is_a_model_id(client, served_tiny) -> None:
    reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2)

    assert reply.model == served_tiny.model_id


def _raw_body(served, text: str) -> bytes:
    return ('{"model": "%s", "max_tokens": 2, %s}' % (served.model_id, text)).encode()


USER = '"messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize("body_fields, param, code", [
    ('"messages": ' + "[" * 100_000 + "]" * 100_000, None, "invalid_json"),
    (USER + ', "seed": ' + "9" * 5000, None, "invalid_json"),
    (USER + ', "temperature": NaN', None, "invalid_json"),
    ('"messages": [{"role": "user", "content": "\\ud800"}]', "messages[0].content", None),
    ('"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]', "messages[0].content", None),
    ('"messages": [{"role": ["user"], "content": "hi"}]', "messages[0].role", None),
    ('"messages": [{"role": {"a": 1}, "content": "hi"}]', "messages[0].role", None),
    (USER + ', "seed": 9223372036854775808', "seed", None),
    (USER + ', "seed": -9223372036854775809', "seed", None),
    (USER + ', "stop": ["\\ud800"]', "stop", None),
])
def test_client_mistakes_are_400s_not_500s(served_tiny, body_fields, param, code) -> None:
    error = assert_openai_error(call(served_tiny.root, "POST", CHAT, _raw_body(served_tiny, body_fields)), 400, param, code)

    assert "TypeError" not in error["message"]
    assert call(served_tiny.root, "GET", "/health")[0] == 200


def test_a_lone_surrogate_in_a_raw_prompt_is_a_400(served_tiny) -> None:
    body = ('{"model": "%s", "prompt": "a\\ud800b", "max_tokens": 2}' % served_tiny.model_id).encode()

    assert_openai_error(call(served_tiny.root, "POST", "/v1/completions", body), 400, "prompt")


def test_the_largest_seed_is_accepted(client, served_tiny) -> None:
    reply = client.chat.completions.create(model=served_tiny.model_id, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2, seed=2**63 - 1)

    assert reply.usage.completion_tokens >= 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_a_body_a_web_page_could_send_without_preflight_is_a_415(served_tiny, content_type) -> None:
    served_tiny.hub.forget_submitted()
    headers = {"Content-Type": content_type} if content_type else {"Content-Type": ""}

    refused = call(served_tiny.root, "POST", CHAT, chat(served_tiny), headers=headers)

    assert_openai_error(refused, 415, code="unsupported_media_type")
    assert not any(isinstance(r, Generate) for r in list(served_tiny.hub.submitted.queue))


def test_json_with_a_charset_is_served(served_tiny) -> None:
    with_charset = {"Content-Type": "application/json; charset=utf-8"}
    reply = call(served_tiny.root, "POST", CHAT, chat(served_tiny), headers=with_charset)

    assert reply[0] == 200


@pytest.mark.parametrize("fields, param", [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -1}, "presence_penalty"),
    ({"presence_penalty": "high"}, "presence_penalty"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"logit_bias": "none"}, "logit_bias"),
    ({"n": True}, "n"),
])
def test_fields_hearth_cannot_honour_are_refused_by_name(served_tiny, fields, param) -> None:
    refused = call(served_tiny.root, "POST", CHAT, chat(served_tiny, **fields))

    assert_openai_error(refused, 400, param, "unsupported_parameter")


def test_neutral_values_of_unsupported_fields_are_accepted(client, served_tiny) -> None:
    reply = client.chat.completions.create(
        model=served_tiny.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        tools=[], tool_choice="none", logprobs=False, top_logprobs=0, frequency_penalty=0, presence_penalty=0.0,
        logit_bias={}, response_format={"type": "text"}, n=1,
    )

    assert reply.choices[0].finish_reason in ("stop", "length")


def test_raw_completions_refuse_penalties_and_best_of(served_tiny) -> None:
    body = {"model": served_tiny.model_id, "prompt": "Once", "max_tokens": 2}

    assert_openai_error(call(served_tiny.root, "POST", "/v1/completions", {**body, "frequency_penalty": 1}), 400,
                        "frequency_penalty", "unsupported_parameter")
    assert_openai_error(call(served_tiny.root, "POST", "/v1/completions", {**body, "best_of": 3}), 400,
                        "best_of", "unsupported_parameter")
    assert call(served_tiny.root, "POST", "/v1/completions", {**body, "logprobs": None, "echo": False})[0] == 200


def _open(root: str) -> socket.socket:
    address = urlsplit(root)
    return socket.create_connection((address.hostname, address.port), timeout=5)


def _closed_within(sock: socket.socket, drip: bytes, limit_s: float) -> float | None:
    """Send ``drip`` a byte a second; the seconds until the server closed the socket, None if it never did."""
    started = time.monotonic()
    for byte in drip:
        try:
            sock.sendall(bytes([byte]))
            sock.settimeout(1.0)
            if sock.recv(1024) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except OSError:  # reset by the server
            return time.monotonic() - started
        if time.monotonic() - started > limit_s:
            return None
    return None


def test_a_client_dripping_its_headers_is_cut_off_and_others_are_served(served_tiny, monkeypatch) -> None:
    monkeypatch.setattr(slow_clients.HeaderDeadlineProtocol, "header_timeout_s", 2.0)
    port = urlsplit(served_tiny.root).port
    drip = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: {'a' * 100}".encode()
    with _open(served_tiny.root) as slow, _open(served_tiny.root) as silent:
        closed_after = _closed_within(slow, drip, limit_s=8)
        served_meanwhile = call(served_tiny.root, "GET", "/health")[0]
        silent.settimeout(5)
        silent_closed = silent.recv(1) == b""

    assert closed_after is not None and closed_after < 5
    assert silent_closed
    assert served_meanwhile == 200


def test_a_kept_alive_connection_dripping_its_next_request_is_cut_off(served_tiny, monkeypatch) -> None:
    monkeypatch.setattr(slow_clients.HeaderDeadlineProtocol, "header_timeout_s", 2.0)
    port = urlsplit(served_tiny.root).port
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    with _open(served_tiny.root) as sock:
        sock.sendall(request)
        first = sock.recv(4096)
        closed_after = _closed_within(sock, request[:-2] + b"X-Slow: " + b"a" * 100, limit_s=8)

    assert first.startswith(b"HTTP/1.1 200")
    assert closed_after is not None and closed_after < 5


def test_a_body_that_trickles_in_too_slowly_is_a_408(served_tiny, monkeypatch) -> None:
    monkeypatch.setattr(completions, "BODY_TIMEOUT_S", 1.0)
    port = urlsplit(served_tiny.root).port
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{").encode()
    with _open(served_tiny.root) as sock:
        sock.sendall(head)
        sock.settimeout(5)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        body = json.loads(answer.read())

    assert answer.status == 408 and body["error"]["code"] == "body_timeout"
