"""The performance panel's list of API server requests: which client, how far, how fast (GUI thread).

``on_request`` takes a ``ServerRequestInfo`` (handed over from the server thread by
a queued Qt signal) and updates that request's row (while a long prompt is read, how far,
in the words the chat's reply uses: ``format.reading_note``); the newest ``MAX_ROWS``
requests are kept, newest first. Each row is a short line of text, so a refresh
costs one label's text.
"""

from __future__ import annotations

import html
from collections import OrderedDict

from PySide6.QtWidgets import QGroupBox, QLabel, QVBoxLayout, QWidget

from app.perf.format import format_count, format_ms, format_tok_s, reading_note
from engine.api.server.metrics import ServerRequestInfo

MAX_ROWS = 8
EMPTY_TEXT = "No API requests yet. Start the server from the Server menu."


def describe(info: ServerRequestInfo) -> str:
    """One request as a line: client, endpoint, state (how far its prompt is read, while it is), then its figures once
    it has any."""
    reading = info.state == "reading"
    state = reading_note(info.read_tokens, info.prompt_tokens) if reading else info.state
    parts = [info.client, info.endpoint.removeprefix("/v1/"), state]
    if info.state not in ("waiting", "reading"):
        parts += [f"{format_count(info.prompt_tokens)} prompt ({format_count(info.cached_tokens)} cached)",
                  f"{format_count(info.completion_tokens)} generated", f"first token {format_ms(info.ttft_ms)}"]
    if info.tok_s > 0:
        parts.append(format_tok_s(info.tok_s))
    return " · ".join(parts)


class ServerRequestList(QGroupBox):
    """"API server requests": one line per recent request."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("API server requests", parent)
        self.setObjectName("server_requests")
        self._rows: OrderedDict[str, ServerRequestInfo] = OrderedDict()
        self.label = QLabel(EMPTY_TEXT, objectName="server_requests_text", wordWrap=True)
        QVBoxLayout(self).addWidget(self.label)

    def on_request(self, info: ServerRequestInfo) -> None:
        self._rows[info.request_id] = info  # an update keeps the request's place
        while len(self._rows) > MAX_ROWS:
            self._rows.popitem(last=False)
        self.label.setText("<br>".join(html.escape(describe(row)) for row in self.rows()))

    def rows(self) -> list[ServerRequestInfo]:
        """Newest first."""
        return list(reversed(self._rows.values()))
