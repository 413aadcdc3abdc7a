"""The two small types that the engine thread, the runtime and the loaders share.

``EventSink`` is how any engine-side code reports an event; it is called on the
engine thread or the loader thread and hands the event on. ``CancelWatch`` is the
engine thread's view of its inbox. Both live here, below the worker, the runtime
and the loaders, so none of those imports another to reach them.
"""

from __future__ import annotations

import collections
import queue
from typing import Callable

from engine.protocol.messages import Cancel, Event, Request, Shutdown

EventSink = Callable[[Event], None]


class CancelWatch:
    """The engine thread's inbox, and which requests were cancelled.

    Every request that arrives is noted as it is read (a ``Cancel`` marks its request
    cancelled; a ``Shutdown`` marks every request cancelled) and kept, in order, for
    the engine thread to handle. ``is_cancelled`` reads the inbox too, so a request
    that runs long inside one call still sees its ``Cancel``.
    """

    def __init__(self, inbox: "queue.Queue[Request]") -> None:
        self._inbox = inbox
        self._cancelled: set[str] = set()
        self._arrived: collections.deque[Request] = collections.deque()
        self._shutting_down = False

    def is_cancelled(self, request_id: str) -> bool:
        self._drain()
        return self._shutting_down or request_id in self._cancelled

    def arrived(self, timeout: float | None = None) -> list[Request]:
        """Every request that arrived and was not taken yet, in order; if there is none, waits up to
        ``timeout`` seconds for one (``0``: not at all) and returns what came (``[]`` if nothing did)."""
        self._drain()
        if not self._arrived and timeout != 0:
            try:
                self._note(self._inbox.get(timeout=timeout))
            except queue.Empty:
                return []
            self._drain()
        taken = list(self._arrived)
        self._arrived.clear()
        return taken

    def next_request(self, timeout: float | None = None) -> Request | None:
        """The oldest request not taken yet, waiting up to ``timeout`` seconds for one (``None`` if none came);
        for a runtime that reads its inbox while it serves one request to its end."""
        if not self._arrived:
            try:
                self._note(self._inbox.get(timeout=timeout))
            except queue.Empty:
                return None
        return self._arrived.popleft()

    def forget(self, request_id: str) -> None:
        """The request has ended: a ``Cancel`` for it no longer matters."""
        self._cancelled.discard(request_id)

    def post(self, request: object) -> None:
        """Queue a follow-up for the engine thread; safe from any thread (a background load uses it)."""
        self._inbox.put(request)  # type: ignore[arg-type]

    def _drain(self) -> None:
        while True:
            try:
                self._note(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _note(self, request: Request) -> None:
        if isinstance(request, Cancel):
            self._cancelled.add(request.request_id)
        self._shutting_down |= isinstance(request, Shutdown)
        self._arrived.append(request)
