"""The one place the GUI talks to the engine (GUI thread, on the qasync loop).

``EngineController`` submits requests to an ``AsyncEngine`` and runs a pump task
that awaits its events and re-emits each one as a Qt signal, one signal per event
kind, carrying the frozen event dataclass, and ``event_received`` for every event
(for views that show all of them, like the performance panel). Widgets connect
to the signals they care about and never see the engine itself.
"""

from __future__ import annotations

import asyncio
import uuid

from PySide6.QtCore import QObject, Signal

from engine.protocol.messages import (
    BatchSampled,
    Cancel,
    ChatMessage,
    EngineError,
    Event,
    FetchProgress,
    Generate,
    InspectFailed,
    InspectModel,
    LoadFailed,
    LoadModel,
    LoadOptions,
    LoadProgress,
    MemorySampled,
    ModelInspected,
    ModelLoaded,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    Request,
    SamplingParams,
    StatusChanged,
    TokenStreamed,
)
from engine.service.client import AsyncEngine
from engine.service.fanout import EngineHub

SIGNAL_FOR_EVENT: dict[type, str] = {
    StatusChanged: "status_changed",
    FetchProgress: "fetch_progress",
    LoadProgress: "load_progress",
    ModelLoaded: "model_loaded",
    LoadFailed: "load_failed",
    PrefillDone: "prefill_done",
    TokenStreamed: "token_streamed",
    ReplyFinished: "reply_finished",
    ReplyFailed: "reply_failed",
    MemorySampled: "memory_sampled",
    BatchSampled: "batch_sampled",
    EngineError: "engine_error",
    ModelInspected: "model_inspected",
    InspectFailed: "inspect_failed",
}


def new_request_id() -> str:
    return uuid.uuid4().hex


class EngineController(QObject):
    """Requests go in through methods; events come out as signals (each carries the event)."""

    status_changed = Signal(object)
    fetch_progress = Signal(object)
    load_progress = Signal(object)
    model_loaded = Signal(object)
    load_failed = Signal(object)
    prefill_done = Signal(object)
    token_streamed = Signal(object)
    reply_finished = Signal(object)
    reply_failed = Signal(object)
    memory_sampled = Signal(object)
    batch_sampled = Signal(object)
    engine_error = Signal(object)
    model_inspected = Signal(object)
    inspect_failed = Signal(object)
    event_received = Signal(object)
    """Every event, after its own signal."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._engine: AsyncEngine | None = None
        self._pump_task: asyncio.Task[None] | None = None

    def start(self, engine: AsyncEngine) -> None:
        """Use ``engine`` from now on and start turning its events into signals.

        Separate from construction so the window can be shown before the engine
        thread starts importing torch.
        """
        if self._engine is not None:
            raise RuntimeError("The engine controller is already started.")
        self._engine = engine
        self._pump_task = asyncio.get_running_loop().create_task(self._pump(engine), name="hearth-event-pump")

    @property
    def engine_hub(self) -> EngineHub | None:
        """The engine thread's hub, for another listener (the API server) to share it; None before ``start``."""
        return getattr(self._engine, "hub", None)

    def submit(self, request: Request) -> None:
        if self._engine is None:
            raise RuntimeError("The engine is not started yet.")
        self._engine.submit(request)

    def send_prompt(
        self,
        conversation_id: str,
        messages: tuple[ChatMessage, ...],
        sampling: SamplingParams = SamplingParams(),
    ) -> str:
        """Ask for a reply to the last user message; returns the request id."""
        request_id = new_request_id()
        self.submit(Generate(request_id, conversation_id, messages, sampling))
        return request_id

    def stop(self, request_id: str) -> None:
        self.submit(Cancel(request_id))

    def load_model(self, path: str, options: LoadOptions = LoadOptions()) -> str:
        request_id = new_request_id()
        self.submit(LoadModel(request_id, path, options))
        return request_id

    def inspect_model(self, path: str, options: LoadOptions = LoadOptions()) -> str:
        """Ask for a memory estimate of ``path`` (answered by ModelInspected or InspectFailed)."""
        request_id = new_request_id()
        self.submit(InspectModel(request_id, path, options))
        return request_id

    def close(self, timeout: float = 5.0) -> None:
        """Stop pumping events and stop the engine thread (a reply in progress is cancelled)."""
        if self._pump_task is not None:
            self._pump_task.cancel()
            self._pump_task = None
        if self._engine is not None:
            self._engine.close(timeout)

    def _dispatch(self, event: Event) -> None:
        """Emit the signal for ``event``, then ``event_received``."""
        getattr(self, SIGNAL_FOR_EVENT[type(event)]).emit(event)
        self.event_received.emit(event)

    async def _pump(self, engine: AsyncEngine) -> None:
        while True:
            self._dispatch(await engine.next_event())
