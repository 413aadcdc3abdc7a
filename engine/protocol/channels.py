"""The two small types that the engine thread, the runtime and the loaders share.

``EventSink`` is how any engine-side code reports an event; it is called on the
engine thread or the loader thread and hands the event on. ``CancelWatch`` is the
engine thread's view of its inbox between two steps of a long request. Both live
here, below the worker, the runtime and the loaders, so none of those imports another
to reach them.
"""

from __future__ import annotations

import collections
import queue
from typing import Callable

from engine.protocol.messages import Cancel, Event, Request, Shutdown

EventSink = Callable[[Event], None]


class CancelWatch:
    """Lets a long request ask "was I cancelled?" between two steps.

    Requests other than ``Cancel`` that arrive meanwhile are kept, in order, for
    the thread to handle next; a ``Shutdown`` also cancels what is running.
    """

    def __init__(self, inbox: "queue.Queue[Request]") -> None:
        self._inbox = inbox
        self._cancelled: set[str] = set()
        self._deferred: collections.deque[Request] = collections.deque()
        self._shutting_down = False

    def is_cancelled(self, request_id: str) -> bool:
        self._drain()
        return self._shutting_down or request_id in self._cancelled

    def next_request(self, timeout: float | None = None) -> Request | None:
        """The next request: a deferred one first, else wait on the inbox (``None`` after ``timeout``)."""
        if self._deferred:
            return self._deferred.popleft()
        try:
            request = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(request, Cancel):
            self._cancelled.add(request.request_id)
        return request

    def take(self, kind: type) -> list:
        """Requests of ``kind`` that arrived meanwhile, in order, taken out of the queue; the rest stay."""
        self._drain()
        taken = [r for r in self._deferred if isinstance(r, kind)]
        if taken:
            self._deferred = collections.deque(r for r in self._deferred if not isinstance(r, kind))
        return taken

    def forget(self, request_id: str) -> None:
        self._cancelled.discard(request_id)

    def post(self, request: object) -> None:
        """Queue a follow-up for the engine thread; safe from any thread (a background load uses it)."""
        self._inbox.put(request)  # type: ignore[arg-type]

    def _drain(self) -> None:
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(request, Cancel):
                self._cancelled.add(request.request_id)
            else:
                self._shutting_down |= isinstance(request, Shutdown)
                self._deferred.append(request)
