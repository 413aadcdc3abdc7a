"""Connections that send their request too slowly are closed (server thread, uvicorn's h11 protocol).

uvicorn times out only an idle kept-alive connection (``timeout_keep_alive``); a
client that opens a socket and then sends its request headers a byte at a time
holds the socket for as long as it likes, and enough of them exhaust the
server's file descriptors. ``HeaderDeadlineProtocol`` gives every request
``HEADER_TIMEOUT_S`` from its first byte (or from the connection's opening) to
complete its headers, then closes the connection. The body has a deadline of its
own in ``completions.read_json``.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0  # an idle connection between requests (uvicorn's own default, stated here)


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request's headers."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and self._awaiting_headers():
            self._arm_header_deadline()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if not self._awaiting_headers():
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.transport.close()
