"""The engine thread: takes requests from a queue, hands them to the runtime, reports events.

Everything in ``EngineThread.run`` and below runs on the engine thread, the only
thread that touches the model. ``submit`` is called from any thread. The runtime
(and with it torch) is imported inside the thread, so starting the engine is cheap
for the caller.
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import Callable, Protocol

from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import EngineError, Generate, ReplyFailed, Request, Shutdown

IDLE_TICK_S = 1.0
ENGINE_FAILURE = "The engine failed while handling this request"  # how a ReplyFailed from a crash begins


class Runtime(Protocol):
    """What the engine thread drives: one request at a time, on the engine thread."""

    def handle(self, request: Request) -> None: ...

    def idle(self) -> None:
        """Called about once a second while no request is waiting (for periodic readings)."""
        ...

    def close(self) -> None: ...


RuntimeFactory = Callable[[EventSink, CancelWatch], Runtime]


def _default_runtime(emit: EventSink, watch: CancelWatch) -> Runtime:
    from engine.service.runtime import ModelRuntime  # imports torch: only ever on the engine thread

    return ModelRuntime(emit, watch)


class EngineThread:
    """Owns the engine thread. ``emit`` is called on the engine thread for every event."""

    def __init__(self, emit: EventSink, runtime_factory: RuntimeFactory = _default_runtime) -> None:
        self._emit = emit
        self._runtime_factory = runtime_factory
        self._inbox: queue.Queue[Request] = queue.Queue()
        self._watch = CancelWatch(self._inbox)
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request) -> None:
        """Queue a request; safe from any thread."""
        self._inbox.put(request)

    def stop(self, timeout: float | None = 10.0) -> None:
        """Ask the thread to finish (cancelling a reply in progress) and wait for it."""
        if self._thread.is_alive():
            self._inbox.put(Shutdown())
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            runtime = self._runtime_factory(self._emit, self._watch)
        except Exception as exc:  # a broken install must not kill the app silently
            self._emit(EngineError(f"The engine could not start: {exc}"))
            return
        try:
            self._serve(runtime)
        finally:
            runtime.close()

    def _serve(self, runtime: Runtime) -> None:
        while True:
            request = self._watch.next_request(timeout=IDLE_TICK_S)
            if request is None:
                runtime.idle()
                continue
            if isinstance(request, Shutdown):
                return
            try:
                runtime.handle(request)
            except Exception as exc:
                traceback.print_exc()
                self._emit(EngineError(f"{type(exc).__name__}: {exc}"))
                if isinstance(request, Generate):  # every Generate ends with a reply event, so no waiter hangs
                    self._emit(ReplyFailed(request.request_id, f"{ENGINE_FAILURE}: {type(exc).__name__}: {exc}"))
