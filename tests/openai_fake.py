"""A small OpenAI-compatible server for tests, on 127.0.0.1 and a free port (its own threads).

``FakeOpenAIServer`` answers ``GET /v1/models`` and streams ``POST /v1/chat/completions``
as chunked server-sent events (``data: {...}``, then ``data: [DONE]``), with the last
chunks carrying ``usage`` and llama.cpp-style ``timings``. ``FakeScript`` says how it
behaves: the reply's pieces, a required API key, and a way to fail (cut the
connection, answer HTML, stream an error, lose the model, or stream until the client
hangs up). Everything it received is kept for the test to check. ``HostileServer``
answers on a raw socket with whatever bytes a test writes (a server that dribbles,
floods or redirects). ``RemoteDriver`` runs the real remote runtime on a real engine
thread for engine tests.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from engine.api.remote.runtime import RemoteRuntime
from engine.protocol.messages import (
    ChatMessage,
    Generate,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
)
from engine.service.worker import EngineThread

ENDLESS_LIMIT_S = 10.0  # an "endless" stream still ends, so a broken test cannot hang
QUESTION = (ChatMessage("system", "Be brief."), ChatMessage("user", "What is the capital of France?"))


@dataclass
class FakeScript:
    models: tuple[str, ...] = ("big-model", "other-model")
    pieces: tuple[str, ...] = ("The", " capital", " is", " Paris", ".")
    piece_delay_s: float = 0.0
    list_delay_s: float = 0.0
    api_key: str = ""
    refusal: str = "Invalid API key"  # the message of a 401
    failure: str = ""
    """"" (none), "cut" (after two pieces), "html" (both routes), "html_reply" (only the chat), "stream_error",
    "gone" (404), "endless", "silent" (no text for seconds, as in a long prefill), "no_models"."""
    usage: dict = field(default_factory=lambda: {
        "prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26, "prompt_tokens_details": {"cached_tokens": 16},
    })
    timings: dict = field(default_factory=lambda: {"prompt_per_second": 812.5, "predicted_per_second": 64.25, "cache_n": 16})
    bodies: list[dict] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)
    client_left: threading.Event = field(default_factory=threading.Event)


def _chunk(delta: dict, finish_reason: str | None = None, **extra: object) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "big-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test output is for the test."""

    def do_GET(self) -> None:
        script = self.server.script
        if not self._authorized(script):
            return
        time.sleep(script.list_delay_s)
        if self.path != "/v1/models":
            return self._send_json(404, {"error": {"message": f"no route {self.path}"}})
        if script.failure == "html":
            return self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
        data = [{"id": name, "object": "model", "owned_by": "test", "max_model_len": 8192} for name in script.models]
        self._send_json(200, {"object": "list", "data": data if script.failure != "no_models" else "nothing"})

    def do_POST(self) -> None:
        script = self.server.script
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        script.bodies.append(body)
        if not self._authorized(script):
            return
        if script.failure == "gone" or body.get("model") not in script.models:
            return self._send_json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        if script.failure in ("html", "html_reply"):
            return self._send(200, b"<html>Bad gateway</html>", "text/html")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._stream(script)
        except OSError:
            script.client_left.set()

    def _stream(self, script: FakeScript) -> None:
        self._event(_chunk({"role": "assistant", "content": ""}))
        if script.failure == "silent":
            time.sleep(ENDLESS_LIMIT_S / 2)
        if script.failure in ("endless", "silent"):
            started = time.monotonic()
            while time.monotonic() - started < ENDLESS_LIMIT_S:
                self._event(_chunk({"content": " more"}))
                time.sleep(0.02)
            return
        for count, piece in enumerate(script.pieces, start=1):
            time.sleep(script.piece_delay_s)
            self._event(_chunk({"content": piece}))
            if count == 2 and script.failure == "cut":
                self.close_connection = True
                return  # no final chunk: the client sees the body end mid-stream
            if count == 2 and script.failure == "stream_error":
                self._event({"error": {"message": "CUDA out of memory on the server", "code": 500}})
                return self._end()
        self._event(_chunk({}, "stop", timings=script.timings))
        self._event({**_chunk({}), "choices": [], "usage": script.usage})
        self._write(b"data: [DONE]\n\n")
        self._end()

    def _event(self, payload: dict) -> None:
        self._write(f"data: {json.dumps(payload)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _authorized(self, script: FakeScript) -> bool:
        header = self.headers.get("Authorization", "")
        script.auth_headers.append(header)
        if script.api_key and header != f"Bearer {script.api_key}":
            self._send_json(401, {"error": {"message": script.refusal, "type": "invalid_request_error"}})
            return False
        return True

    def _send_json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: FakeScript


class FakeOpenAIServer:
    """Serves ``script`` on 127.0.0.1 at ``base_url`` until ``close``."""

    def __init__(self, script: FakeScript) -> None:
        self.script = script
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.script = script
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


Answer = Callable[[socket.socket], None]
MODEL_LIST = json.dumps({"object": "list", "data": [{"id": "big-model", "object": "model", "max_model_len": 8192}]})


def list_models(sock: socket.socket) -> None:
    """A well-behaved answer to ``GET /v1/models`` that lists ``big-model``."""
    sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(MODEL_LIST)}\r\n\r\n"
                 f"{MODEL_LIST}".encode())


class HostileServer:
    """Answers ``GET /v1/models`` with ``on_list`` and every POST with ``on_chat``, on raw sockets (a thread each).

    ``chat_asked`` is set once a POST has been read, ``client_left`` once writing to a client failed.
    """

    def __init__(self, on_chat: Answer, on_list: Answer = list_models) -> None:
        self._answers = {"GET": on_list, "POST": on_chat}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.chat_asked = threading.Event()
        self.client_left = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(sock,), daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        with sock:
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            headers, _, body = head.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += sock.recv(65536)
            method = headers.split(b" ")[0].decode()
            if method == "POST":
                self.chat_asked.set()
            try:
                self._answers[method](sock)
            except OSError:
                self.client_left.set()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (at the moment of asking)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RemoteDriver:
    """The test thread's side: submit requests, collect the events the engine thread emits."""

    def __init__(self) -> None:
        self.events: queue.Queue[object] = queue.Queue()
        self.thread = EngineThread(self.events.put, RemoteRuntime)
        self.thread.start()

    def wait_for(self, *kinds: type, timeout: float = 10.0) -> tuple[object, list[object]]:
        """The first event of one of ``kinds``, and every event before it."""
        seen: list[object] = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, kinds):
                return event, seen
            seen.append(event)

    def connect(self, server: RemoteServer, model: str = "big-model") -> object:
        self.thread.submit(LoadModel(uuid.uuid4().hex, model, server=server))
        return self.wait_for(ModelLoaded, LoadFailed)[0]

    def ask(self, request_id: str = "reply-1") -> tuple[object, list[object]]:
        self.thread.submit(Generate(request_id, "chat-1", QUESTION, SamplingParams(temperature=0.0, max_new_tokens=64)))
        return self.wait_for(ReplyFinished, ReplyFailed)
