"""The one place the GUI talks to the engine (GUI thread, on the qasync loop).

``EngineController`` submits requests to an ``AsyncEngine`` and runs a pump task
that awaits its events and re-emits each one as a Qt signal, one signal per event
kind, carrying the frozen event dataclass, and ``event_received`` for every event
(for views that show all of them, like the performance panel). Widgets connect
to the signals they care about and never see the engine itself.

It may own two engines: the embedded one, and, from the first request for a
model on a remote server, a second one whose runtime talks to that server
(``engine.api.remote.runtime``). Replies go to whichever engine last loaded a
model; a Cancel goes to the engine its request went to.
"""

from __future__ import annotations

import asyncio
import uuid

from PySide6.QtCore import QObject, Signal

from engine.api.remote.runtime import RemoteRuntime
from engine.protocol.messages import (
    BatchSampled,
    Cancel,
    ChatMessage,
    Constraint,
    EngineError,
    Event,
    FetchProgress,
    ForgetConversation,
    Generate,
    InspectFailed,
    InspectModel,
    ListRemoteModels,
    LoadFailed,
    LoadModel,
    LoadOptions,
    LoadProgress,
    MemorySampled,
    ModelInspected,
    ModelLoaded,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    RemoteModelsFailed,
    RemoteModelsListed,
    RemoteServer,
    Request,
    SamplingParams,
    StatusChanged,
    TokenStreamed,
)
from engine.service.client import AsyncEngine
from engine.service.fanout import EngineHub
from engine.service.worker import RuntimeFactory

SIGNAL_FOR_EVENT: dict[type, str] = {
    StatusChanged: "status_changed",
    FetchProgress: "fetch_progress",
    LoadProgress: "load_progress",
    ModelLoaded: "model_loaded",
    LoadFailed: "load_failed",
    PromptProgress: "prompt_progress",
    PrefillDone: "prefill_done",
    TokenStreamed: "token_streamed",
    ReplyFinished: "reply_finished",
    ReplyFailed: "reply_failed",
    MemorySampled: "memory_sampled",
    BatchSampled: "batch_sampled",
    EngineError: "engine_error",
    ModelInspected: "model_inspected",
    InspectFailed: "inspect_failed",
    RemoteModelsListed: "remote_models_listed",
    RemoteModelsFailed: "remote_models_failed",
}
FINAL_EVENTS = (
    ModelLoaded, LoadFailed, ReplyFinished, ReplyFailed, ModelInspected, InspectFailed, RemoteModelsListed, RemoteModelsFailed,
)
"""The events that end a request: after one, a Cancel of that request id has nowhere to go."""


def new_request_id() -> str:
    return uuid.uuid4().hex


class EngineController(QObject):
    """Requests go in through methods; events come out as signals (each carries the event)."""

    status_changed = Signal(object)
    fetch_progress = Signal(object)
    load_progress = Signal(object)
    model_loaded = Signal(object)
    load_failed = Signal(object)
    prompt_progress = Signal(object)
    prefill_done = Signal(object)
    token_streamed = Signal(object)
    reply_finished = Signal(object)
    reply_failed = Signal(object)
    memory_sampled = Signal(object)
    batch_sampled = Signal(object)
    engine_error = Signal(object)
    model_inspected = Signal(object)
    inspect_failed = Signal(object)
    remote_models_listed = Signal(object)
    remote_models_failed = Signal(object)
    event_received = Signal(object)
    """Every event, after its own signal."""

    def __init__(self, parent: QObject | None = None, remote_runtime: RuntimeFactory = RemoteRuntime) -> None:
        super().__init__(parent)
        self._engine: AsyncEngine | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._remote_runtime = remote_runtime
        self._remote: AsyncEngine | None = None
        self._remote_pump: asyncio.Task[None] | None = None
        self._answering: AsyncEngine | None = None  # the engine that loaded the model in use
        self._routes: dict[str, AsyncEngine] = {}  # request id → the engine it went to, until its final event

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
        """Send ``request`` to the engine it is for (see the module docstring)."""
        if self._engine is None:
            raise RuntimeError("The engine is not started yet.")
        if isinstance(request, ForgetConversation) and self._remote is not None:
            self._remote.submit(request)
        engine = self._engine_for(request)
        if isinstance(request, (LoadModel, Generate, InspectModel, ListRemoteModels)):
            self._routes[request.request_id] = engine
        engine.submit(request)

    def _engine_for(self, request: Request) -> AsyncEngine:
        if isinstance(request, ListRemoteModels) or (isinstance(request, LoadModel) and request.server is not None):
            return self._remote_engine()
        if isinstance(request, Cancel):
            return self._routes.get(request.request_id) or self._answering or self._engine
        if isinstance(request, Generate):
            return self._answering or self._engine
        return self._engine

    def _remote_engine(self) -> AsyncEngine:
        """The engine of remote models, started the first time one is asked for."""
        if self._remote is None:
            self._remote = AsyncEngine(self._remote_runtime)
            self._remote_pump = asyncio.get_running_loop().create_task(self._pump(self._remote), name="hearth-remote-pump")
        return self._remote

    def send_prompt(
        self,
        conversation_id: str,
        messages: tuple[ChatMessage, ...],
        sampling: SamplingParams = SamplingParams(),
        constraint: Constraint | None = None,
        tools: tuple[str, ...] = (),
    ) -> str:
        """Ask for a reply to the last user message, under ``constraint`` if any, offering the functions ``tools``
        (``Generate.tools``); returns the request id."""
        request_id = new_request_id()
        self.submit(Generate(request_id, conversation_id, messages, sampling, constraint=constraint, tools=tools))
        return request_id

    def stop(self, request_id: str) -> None:
        self.submit(Cancel(request_id))

    def load_model(self, path: str, options: LoadOptions = LoadOptions(), server: RemoteServer | None = None) -> str:
        """Load ``path``, or with ``server`` use the model of that id on the remote server."""
        request_id = new_request_id()
        self.submit(LoadModel(request_id, path, options, server))
        return request_id

    def list_remote_models(self, server: RemoteServer) -> str:
        """Ask ``server`` for its models (answered by RemoteModelsListed or RemoteModelsFailed)."""
        request_id = new_request_id()
        self.submit(ListRemoteModels(request_id, server))
        return request_id

    def inspect_model(self, path: str, options: LoadOptions = LoadOptions()) -> str:
        """Ask for a memory estimate of ``path`` (answered by ModelInspected or InspectFailed)."""
        request_id = new_request_id()
        self.submit(InspectModel(request_id, path, options))
        return request_id

    def close(self, timeout: float = 5.0) -> None:
        """Stop pumping events and stop the engine thread (a reply in progress is cancelled)."""
        for task in (self._pump_task, self._remote_pump):
            if task is not None:
                task.cancel()
        self._pump_task = self._remote_pump = None
        for engine in (self._engine, self._remote):
            if engine is not None:
                engine.close(timeout)

    def _dispatch(self, event: Event, engine: AsyncEngine) -> None:
        """Note where replies go now, emit the signal for ``event``, then ``event_received``."""
        if isinstance(event, FINAL_EVENTS):
            self._routes.pop(event.request_id, None)
        if isinstance(event, ModelLoaded):
            self._answering = engine
        getattr(self, SIGNAL_FOR_EVENT[type(event)]).emit(event)
        self.event_received.emit(event)

    async def _pump(self, engine: AsyncEngine) -> None:
        while True:
            self._dispatch(await engine.next_event(), engine)
