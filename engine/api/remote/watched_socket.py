"""A socket whose blocking reads and writes wake every ``POLL_S`` to look for a Cancel and a deadline (engine thread).

``http.client`` blocks in the socket until the server sends something: while a
server has not sent its headers, or sends them a byte at a time, nothing else runs
on the engine thread, so neither Stop nor a time limit could end the wait.
``WatchedSocket`` stands in for the connection's socket (``http.client`` only
calls ``sendall``, ``makefile`` and ``close`` on it): each wait lasts at most
``POLL_S``, after which it raises ``Cancelled`` if ``is_cancelled()`` says so,
and ``TooSlow`` once its deadline has passed; ``connect`` waits for the
connection the same way. The deadline is first one for the
whole exchange (a server dribbling its headers still runs out of time); a
streamed body switches to a limit on silence with ``allow_silence``.
"""

from __future__ import annotations

import errno
import io
import os
import select
import socket
import time
from collections.abc import Callable

POLL_S = 0.05


class Cancelled(Exception):
    """The request was cancelled while waiting for the server."""


class TooSlow(TimeoutError):
    """The deadline passed; ``str()`` says what the wait was for, e.g. ``no answer within 30 s``."""


def connect(host: str, port: int, is_cancelled: Callable[[], bool], timeout_s: float) -> socket.socket:
    """A TCP socket connected to ``host:port`` within ``timeout_s``, the wait ending within ``POLL_S`` of a Cancel.

    Raises ``Cancelled``, or the ``OSError`` of the last address tried (``TimeoutError`` when none answered).
    The socket is left blocking with a timeout of ``timeout_s`` (a TLS handshake may follow).
    """
    deadline = time.monotonic() + timeout_s
    failure: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            _connect_watched(sock, address, is_cancelled, deadline)
        except OSError as error:
            sock.close()
            failure = error
            continue
        except Cancelled:
            sock.close()
            raise
        sock.settimeout(timeout_s)
        return sock
    raise failure


def _connect_watched(sock: socket.socket, address: tuple, is_cancelled: Callable[[], bool], deadline: float) -> None:
    sock.setblocking(False)
    code = sock.connect_ex(address)
    while code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
        if is_cancelled():
            raise Cancelled
        if time.monotonic() > deadline:
            raise TimeoutError("no answer")
        _, writable, _ = select.select([], [sock], [], POLL_S)
        if writable:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))  # ConnectionRefusedError and kin, by the code


class WatchedSocket:
    """``sock`` (connected) with waits that give up on a Cancel or a deadline of ``deadline_s`` from now."""

    def __init__(self, sock: socket.socket, is_cancelled: Callable[[], bool], deadline_s: float) -> None:
        sock.settimeout(POLL_S)
        self._sock = sock
        self._is_cancelled = is_cancelled
        self._deadline = time.monotonic() + deadline_s
        self._reason = f"no answer within {deadline_s:.0f} s"
        self._silence_s: float | None = None
        self._readers = 0
        self._closed = False

    def allow_silence(self, silence_s: float) -> None:
        """From now on, give up only when nothing arrives for ``silence_s`` (a reply streamed for minutes)."""
        self._silence_s = silence_s
        self._deadline = time.monotonic() + silence_s
        self._reason = f"nothing arrived for {silence_s:.0f} s"

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._check()
            try:
                sent = self._sock.send(view)
            except TimeoutError:
                continue  # the server is not reading yet
            view = view[sent:]

    def recv_into(self, buffer: memoryview | bytearray) -> int:
        while True:
            self._check()
            try:
                count = self._sock.recv_into(buffer)
            except TimeoutError:
                continue
            if self._silence_s is not None:
                self._deadline = time.monotonic() + self._silence_s
            return count

    def makefile(self, mode: str = "rb", buffering: int | None = None) -> io.BufferedReader:
        """The reader ``http.client`` parses the answer from; like a socket's, it keeps the socket open until closed."""
        self._readers += 1
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        """Close once no reader is open: told "Connection: close", ``http.client`` closes the connection but reads on."""
        self._closed = True
        if self._readers == 0:
            self._sock.close()

    def abort(self) -> None:
        """Drop the connection now, readers or not: the server sees the client leave at once."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
        self._sock.close()

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers == 0:
            self._sock.close()

    def _check(self) -> None:
        if self._is_cancelled():
            raise Cancelled
        if time.monotonic() > self._deadline:
            raise TooSlow(self._reason)


class _Reader(io.RawIOBase):
    """The raw stream under ``WatchedSocket.makefile``'s buffer."""

    def __init__(self, sock: WatchedSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()
