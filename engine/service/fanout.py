"""One engine thread, several listeners: the GUI's ``AsyncEngine`` and the API server.

``EngineHub`` owns an ``EngineThread`` and routes each event it emits. An event that
belongs to a request (it has a ``request_id``) goes only to the listener that
submitted that request; every other event (status, memory, batch figures, errors)
goes to all listeners, and so does ``ModelLoaded``, because a new model concerns
everyone. A listener that joins late is told the last status and the last model at
once, so a server started after the load still knows what it serves. ``load_and_wait``
is the blocking load of the CLI, the benchmarks and the tests.

``_dispatch`` runs on the engine thread (and the loader thread); ``listen``,
``submit`` and ``unlisten`` are called from any thread. Listeners must be cheap and
thread-safe: they hand the event on (``loop.call_soon_threadsafe``) and return.
"""

from __future__ import annotations

import queue
import threading

from engine.protocol.channels import EventSink
from engine.protocol.messages import (
    Cancel,
    EngineError,
    Event,
    InspectFailed,
    LoadFailed,
    LoadModel,
    ModelInspected,
    ModelLoaded,
    ReplyFailed,
    ReplyFinished,
    Request,
    StatusChanged,
)
from engine.service.worker import EngineThread, RuntimeFactory, _default_runtime

FINAL_EVENTS = (ReplyFinished, ReplyFailed, ModelLoaded, LoadFailed, ModelInspected, InspectFailed)


def _discard(event: Event) -> None:
    """The owner of requests whose listener has gone."""


class EngineHub:
    """An engine thread whose events fan out to the listeners that asked for them."""

    def __init__(self, runtime_factory: RuntimeFactory = _default_runtime) -> None:
        self._lock = threading.Lock()
        self._listeners: list[EventSink] = []
        self._owners: dict[str, EventSink] = {}  # request id → the listener that submitted it
        self._last_status: StatusChanged | None = None
        self._last_model: ModelLoaded | None = None
        self._thread = EngineThread(self._dispatch, runtime_factory)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        self._thread.stop(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.alive

    def listen(self, sink: EventSink) -> None:
        """Add a listener; it is handed the last status and model right away (on the caller's thread)."""
        with self._lock:
            self._listeners.append(sink)
            known = [event for event in (self._last_model, self._last_status) if event is not None]
        for event in known:
            sink(event)

    def unlisten(self, sink: EventSink) -> None:
        """Remove a listener; the rest of its requests' events are dropped, never handed to the others."""
        with self._lock:
            # ``!=``, not ``is not``: each ``obj.method`` is a new bound-method object, equal to the last
            self._listeners = [listener for listener in self._listeners if listener != sink]
            self._owners = {rid: _discard if owner == sink else owner for rid, owner in self._owners.items()}

    def submit(self, request: Request, owner: EventSink | None = None) -> None:
        """Queue ``request``; the events of its request id go to ``owner`` only (a ``Cancel`` claims nothing)."""
        request_id = getattr(request, "request_id", None)
        if owner is not None and request_id is not None and not isinstance(request, Cancel):
            with self._lock:
                self._owners[request_id] = owner
        self._thread.submit(request)

    def load_and_wait(self, request: LoadModel, timeout: float | None = None) -> ModelLoaded | LoadFailed | EngineError:
        """Submit ``request`` and block until it ends (``queue.Empty`` after ``timeout``); for callers off any event loop."""
        ended: queue.Queue[Event] = queue.Queue()
        keep = lambda event: ended.put(event) if isinstance(event, (ModelLoaded, LoadFailed, EngineError)) else None
        self.listen(keep)  # an EngineError is global: only listeners hear it
        try:
            self.submit(request, keep)
            while True:
                event = ended.get(timeout=timeout)
                if isinstance(event, EngineError) or getattr(event, "request_id", None) == request.request_id:
                    return event  # type: ignore[return-value]
        finally:
            self.unlisten(keep)

    def _dispatch(self, event: Event) -> None:
        request_id = getattr(event, "request_id", None)
        with self._lock:
            if isinstance(event, StatusChanged):
                self._last_status = event
            elif isinstance(event, ModelLoaded):
                self._last_model = event
            owner = self._owners.get(request_id) if request_id is not None else None
            if owner is not None and isinstance(event, FINAL_EVENTS):
                del self._owners[request_id]
            everyone = list(self._listeners)
        if owner is not None and (not isinstance(event, ModelLoaded) or owner not in everyone):
            owner(event)
        if owner is None or isinstance(event, ModelLoaded):
            for listener in everyone:
                listener(event)
