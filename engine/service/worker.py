"""The engine thread: one loop that takes every request that arrived, serves it, and steps the runtime.

Everything in ``EngineThread.run`` and below runs on the engine thread, the only
thread that touches the model. ``submit`` is called from any thread. The runtime
(and with it torch) is imported inside the thread, so starting the engine is cheap
for the caller.

One turn of the loop: every request that arrived since the last turn is handled at
once (a ``Generate`` joins the running replies, a ``Cancel``, ``LoadModel``,
``InspectModel`` or ``ForgetConversation`` is served right away), then the runtime
runs one step of its running replies. With no reply running, the loop waits on the
inbox, and about once a second with nothing to do calls ``idle``. So no request
waits for the running replies to end, only for the step in progress.
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import Callable, Protocol

from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import (
    EngineError,
    Generate,
    ReplyFailed,
    Request,
    Shutdown,
    engine_failure_message,
)

IDLE_TICK_S = 1.0
SHUT_DOWN_MESSAGE = "The engine shut down before this request was served."


class Runtime(Protocol):
    """What the engine thread drives, on the engine thread.

    ``handle`` serves a request without waiting for the running replies; ``step`` runs one
    step of them (one forward pass) and is called only while ``has_work``. ``close`` ends
    every reply still running with its end event, and frees what the runtime holds.
    """

    @property
    def has_work(self) -> bool: ...

    def handle(self, request: Request) -> None: ...

    def step(self) -> None: ...

    def idle(self) -> None:
        """Called about once a second while nothing runs and no request is waiting (for periodic readings)."""
        ...

    def close(self) -> None: ...


class ServesWhole:
    """For a runtime whose ``handle`` serves each request to its end: nothing runs between two requests."""

    has_work = False

    def step(self) -> None:
        """Never called: ``has_work`` is always false."""


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
        """Ask the thread to finish after the step in progress (every running reply ends) and wait for it."""
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
            arrived = self._watch.arrived(timeout=0 if runtime.has_work else IDLE_TICK_S)
            if not arrived and not runtime.has_work:
                runtime.idle()
            for index, request in enumerate(arrived):
                if isinstance(request, Shutdown):
                    self._refuse(arrived[index + 1 :])
                    return
                self._handle(runtime, request)
            if runtime.has_work:
                self._step(runtime)

    def _handle(self, runtime: Runtime, request: Request) -> None:
        """A failure is reported and the loop goes on; a failed ``Generate`` ends with a reply event, so no waiter
        hangs."""
        try:
            runtime.handle(request)
        except Exception as exc:
            self._report(exc)
            if isinstance(request, Generate):
                self._emit(ReplyFailed(request.request_id, engine_failure_message(exc)))

    def _step(self, runtime: Runtime) -> None:
        """A failure is reported and the loop goes on (the runtime has ended the replies the step left)."""
        try:
            runtime.step()
        except Exception as exc:
            self._report(exc)

    def _report(self, exc: Exception) -> None:
        traceback.print_exc()
        self._emit(EngineError(f"{type(exc).__name__}: {exc}"))

    def _refuse(self, requests: list[Request]) -> None:
        """Replies asked for after the ``Shutdown`` end at once, so that no waiter hangs."""
        for request in requests:
            if isinstance(request, Generate):
                self._emit(ReplyFailed(request.request_id, SHUT_DOWN_MESSAGE))
