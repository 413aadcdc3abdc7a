"""A stand-in for the engine that replies with scripted text, for what the tiny models never write (tool calls).

``ScriptedHub`` has the three methods the API server uses (``listen``, ``unlisten``, ``submit``): it announces a
loaded model whose chat template writes tool calls as ``tool_format`` says, remembers each ``Generate``, and answers
it at once with the next scripted reply, a few characters per ``TokenStreamed`` (test thread, server thread).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from engine.api.server.config import ServerConfig
from engine.api.server.server import ApiServer
from engine.protocol.messages import (
    Generate,
    ModelLoaded,
    PrefillDone,
    ReplyFinished,
    RequestStats,
    StatusChanged,
    TokenStreamed,
)

MODEL = "scripted-model"
PIECE_CHARS = 5


class ScriptedHub:
    def __init__(self, tool_format: str) -> None:
        self._tool_format = tool_format
        self._listeners: list = []
        self.replies: deque[tuple[str, str]] = deque()  # (text, engine finish reason)
        self.requests: list[Generate] = []

    def script(self, text: str, finish: str = "eos") -> None:
        self.replies.append((text, finish))

    def listen(self, sink) -> None:
        self._listeners.append(sink)
        sink(ModelLoaded("load", MODEL, "/models/scripted", "cpu", "fp32", 4096, 0.0, tool_format=self._tool_format))
        sink(StatusChanged("ready"))

    def unlisten(self, sink) -> None:
        self._listeners.remove(sink)

    def submit(self, request, owner=None) -> None:
        if not isinstance(request, Generate):
            return
        self.requests.append(request)
        text, finish = self.replies.popleft()
        rid = request.request_id
        owner(PrefillDone(rid, 0.1, 12, 0, 1.0, 4096))
        for start in range(0, len(text), PIECE_CHARS):
            owner(TokenStreamed(rid, text[start:start + PIECE_CHARS], start // PIECE_CHARS + 1, 10.0, 0.0))
        owner(ReplyFinished(rid, text, RequestStats(tokens_generated=len(text) // PIECE_CHARS + 1, finish_reason=finish)))


@contextmanager
def serve_scripted(tool_format: str) -> Iterator[tuple[ScriptedHub, ApiServer]]:
    """A server over a ``ScriptedHub`` as ``(hub, server)``; stopped on leaving."""
    hub = ScriptedHub(tool_format)
    server = ApiServer(hub, ServerConfig(port=0))  # type: ignore[arg-type]
    server.start()
    try:
        yield hub, server
    finally:
        server.stop()
