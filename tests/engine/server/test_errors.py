"""Every bad request gets an OpenAI-shaped error with the right status, and the server stays up."""

from __future__ import annotations

import http.client
import json
import queue
from urllib.parse import urlsplit

import openai
import pytest

from engine.api.server.config import ServerConfig
from engine.api.server.server import ApiServer
from engine.protocol.messages import Generate, ModelLoaded, StatusChanged
from engine.service.fanout import EngineHub
from engine.service.worker import ServesWhole

CHAT = "/v1/chat/completions"


def call(root: str, method: str, path: str, body: object = None, headers: dict | None = None):
    """(status, parsed JSON or text, headers) of one raw HTTP request; ``body`` bytes go as they are."""
    address = urlsplit(root)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    payload = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    connection.request(method, path, payload, {"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    try:
        return response.status, json.loads(text), dict(response.getheaders())
    except json.JSONDecodeError:
        return response.status, text, dict(response.getheaders())


def assert_openai_error(reply, status: int, param: str | None = None, code: str | None = None) -> dict:
    got_status, body, _ = reply
    assert got_status == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def chat(served, **fields) -> dict:
    return {"model": served.model_id, "messages": [{"role": "user", "content": "Paris"}], "max_tokens": 2, **fields}


def test_broken_json_is_a_400_and_the_server_stays_up(served_tiny) -> None:
    assert_openai_error(call(served_tiny.root, "POST", CHAT, b'{"model": "x", "messages": ['), 400, code="invalid_json")
    assert_openai_error(call(served_tiny.root, "POST", CHAT, b"\xff\xfe"), 400, code="invalid_json")
    assert_openai_error(call(served_tiny.root, "POST", CHAT, [1, 2]), 400)

    assert call(served_tiny.root, "GET", "/health")[0] == 200
    assert call(served_tiny.root, "POST", CHAT, chat(served_tiny))[0] == 200


def test_an_unknown_model_is_a_404(served_tiny) -> None:
    client = openai.OpenAI(base_url=served_tiny.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])

    assert refused.value.body["code"] == "model_not_found"
    assert served_tiny.model_id in refused.value.body["message"]


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"temperature": 5}, "temperature"),
    ({"top_p": "high"}, "top_p"),
    ({"seed": True}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"n": 3}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ({"model": None}, "model"),
])
def test_bad_fields_are_400s_that_name_the_field(served_tiny, fields, param) -> None:
    assert_openai_error(call(served_tiny.root, "POST", CHAT, chat(served_tiny, **fields)), 400, param=param)


def test_a_prompt_longer_than_the_context_is_a_400(served_tiny) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 400
    error = assert_openai_error(call(served_tiny.root, "POST", "/v1/completions",
                                     {"model": served_tiny.model_id, "prompt": long_text, "max_tokens": 4}), 400)
    streamed = call(served_tiny.root, "POST", CHAT, chat(served_tiny, stream=True,
                                                          messages=[{"role": "user", "content": long_text}]))

    assert "context" in error["message"]
    assert_openai_error(streamed, 400)


def test_a_foreign_host_header_is_refused(served_tiny) -> None:
    port = urlsplit(served_tiny.root).port
    refused = call(served_tiny.root, "GET", "/v1/models", headers={"Host": f"attacker.example:{port}"})
    by_localhost = call(served_tiny.root, "GET", "/v1/models", headers={"Host": f"localhost:{port}"})

    assert_openai_error(refused, 400, code="invalid_host")
    assert by_localhost[0] == 200


def test_unknown_paths_and_methods_are_openai_shaped(served_tiny) -> None:
    assert_openai_error(call(served_tiny.root, "GET", "/v1/embeddings"), 404)
    assert_openai_error(call(served_tiny.root, "GET", CHAT), 405)


def test_no_cors_headers_unless_configured(served_tiny) -> None:
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    _, _, plain_headers = call(served_tiny.root, "OPTIONS", CHAT, headers=preflight)
    server = served_tiny.start_another(ServerConfig(port=0, cors_origins=("http://editor.example",)))
    try:
        root = server.url.removesuffix("/v1")
        _, _, allowed = call(root, "OPTIONS", CHAT, headers={**preflight, "Origin": "http://editor.example"})
        _, _, other = call(root, "OPTIONS", CHAT, headers=preflight)
    finally:
        server.stop()

    assert "access-control-allow-origin" not in {name.lower() for name in plain_headers}
    assert allowed.get("access-control-allow-origin") == "http://editor.example"
    assert "access-control-allow-origin" not in {name.lower() for name in other}


def test_a_body_over_the_limit_is_a_413(served_tiny) -> None:
    server = served_tiny.start_another(ServerConfig(port=0, max_body_bytes=2048))
    try:
        root = server.url.removesuffix("/v1")
        too_big = call(root, "POST", CHAT, chat(served_tiny, messages=[{"role": "user", "content": "x" * 5000}]))
        fits = call(root, "POST", CHAT, chat(served_tiny))
    finally:
        server.stop()

    assert_openai_error(too_big, 413, code="body_too_large")
    assert fits[0] == 200


def test_an_api_key_is_required_when_set(served_tiny) -> None:
    server = served_tiny.start_another(ServerConfig(port=0, api_key="s3cret"))
    try:
        root = server.url.removesuffix("/v1")
        missing = call(root, "GET", "/v1/models")
        wrong = call(root, "GET", "/v1/models", headers={"Authorization": "Bearer guess"})
        health = call(root, "GET", "/health")
        keyed = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        listed = [model.id for model in keyed.models.list()]
    finally:
        server.stop()

    assert_openai_error(missing, 401, code="invalid_api_key")
    assert_openai_error(wrong, 401, code="invalid_api_key")
    assert health[0] == 200
    assert listed == [served_tiny.model_id]


def test_binding_beyond_loopback_needs_a_key() -> None:
    with pytest.raises(ValueError, match="API key"):
        ApiServer(EngineHub(), ServerConfig(host="0.0.0.0", port=0))
    ServerConfig(host="0.0.0.0", port=0, api_key="k").check()


class _StuckRuntime(ServesWhole):
    """A runtime that reports one state and never gets a model: the server must answer 503, not hang."""

    state = "loading"

    def __init__(self, emit, watch) -> None:
        emit(StatusChanged(self.state, "…"))

    def handle(self, request) -> None: ...

    def idle(self) -> None: ...

    def close(self) -> None: ...


class _NoModelRuntime(_StuckRuntime):
    state = "idle"


@pytest.mark.parametrize("runtime, status", [(_StuckRuntime, "loading"), (_NoModelRuntime, "unavailable")])
def test_without_a_ready_model_the_server_answers_503(runtime, status) -> None:
    hub = EngineHub(runtime)
    seen: queue.Queue = queue.Queue()
    hub.listen(seen.put)
    hub.start()
    assert isinstance(seen.get(timeout=30), StatusChanged)  # the state is known before the server starts
    server = ApiServer(hub, ServerConfig(port=0))
    server.start()
    try:
        root = server.url.removesuffix("/v1")
        health = call(root, "GET", "/health")
        refused = call(root, "POST", CHAT, {"model": "any", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        server.stop()
        hub.stop()

    assert health[0] == 503 and health[1]["status"] == status
    assert_openai_error(refused, 503, code="model_not_ready")


def test_metrics_are_prometheus_text(served_tiny) -> None:
    call(served_tiny.root, "POST", CHAT, chat(served_tiny))
    status, text, headers = call(served_tiny.root, "GET", "/metrics")

    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("hearth_requests_running", "hearth_requests_waiting", "hearth_generation_tokens_total",
                 "hearth_time_to_first_token_seconds_count", "hearth_kv_cache_bytes"):
        assert f"\n{name} " in text or f"\n{name}{{" in text
    assert "# TYPE hearth_time_to_first_token_seconds histogram" in text


class _CrashingRuntime(ServesWhole):
    """Has a model, but every reply raises inside the engine (a bug, a lost device)."""

    def __init__(self, emit, watch) -> None:
        emit(ModelLoaded("load", "crashy", "crashy", "cpu", "fp32", 256, 0.0))
        emit(StatusChanged("ready", "crashy"))

    def handle(self, request) -> None:
        if isinstance(request, Generate):
            raise RuntimeError("device lost")

    def idle(self) -> None: ...

    def close(self) -> None: ...


def test_an_engine_failure_is_a_500_and_the_server_stays_up() -> None:
    hub = EngineHub(_CrashingRuntime)
    seen: queue.Queue = queue.Queue()
    hub.listen(seen.put)
    hub.start()
    while not isinstance(seen.get(timeout=30), StatusChanged):
        pass
    server = ApiServer(hub, ServerConfig(port=0))
    server.start()
    try:
        root = server.url.removesuffix("/v1")
        body = {"model": "crashy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        whole = call(root, "POST", CHAT, body)
        streamed = call(root, "POST", CHAT, {**body, "stream": True})
        health = call(root, "GET", "/health")
    finally:
        server.stop()
        hub.stop()

    assert "device lost" in assert_openai_error(whole, 500, code="generation_failed")["message"]
    assert_openai_error(streamed, 500)
    assert health[0] == 200
