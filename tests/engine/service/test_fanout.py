"""One engine thread, two listeners: each gets the events of its own requests and every global event."""

from __future__ import annotations

import queue

from engine.protocol.messages import (
    Generate,
    LoadModel,
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    ReplyFinished,
    RequestStats,
    StatusChanged,
    TokenStreamed,
)
from engine.service.fanout import EngineHub
from engine.service.worker import ServesWhole


class _EchoRuntime(ServesWhole):
    """Answers each Generate with one token and a finish, each LoadModel with a ModelLoaded; idles with memory."""

    def __init__(self, emit, watch) -> None:
        self._emit = emit

    def handle(self, request) -> None:
        if isinstance(request, Generate):
            self._emit(TokenStreamed(request.request_id, "hi", 1, 0.0, 0.0))
            self._emit(ReplyFinished(request.request_id, "hi", RequestStats()))
        elif isinstance(request, LoadModel):
            self._emit(ModelLoaded(request.request_id, "echo", request.path, "cpu", "fp32", 64, 0.0))
            self._emit(StatusChanged("ready", "echo"))

    def idle(self) -> None:
        self._emit(MemorySampled(MemoryStats(), 0.0))

    def close(self) -> None: ...


def _collect(events: queue.Queue, until: type, limit: int = 50) -> list:
    seen = []
    while len(seen) < limit:
        seen.append(events.get(timeout=10))
        if isinstance(seen[-1], until):
            return seen
    raise AssertionError(f"no {until.__name__} in {seen}")


def test_each_listener_gets_its_own_requests_and_the_global_events() -> None:
    hub = EngineHub(_EchoRuntime)
    gui, server = queue.Queue(), queue.Queue()
    hub.listen(gui.put)
    hub.listen(server.put)
    hub.start()
    try:
        hub.submit(LoadModel("load", "x"), gui.put)
        hub.submit(Generate("from-gui", "c1", ()), gui.put)
        hub.submit(Generate("from-server", "c2", ()), server.put)
        gui_events = _collect(gui, MemorySampled)
        server_events = _collect(server, MemorySampled)
    finally:
        hub.stop()

    ids = lambda events: {getattr(e, "request_id", None) for e in events if isinstance(e, (TokenStreamed, ReplyFinished))}
    assert ids(gui_events) == {"from-gui"}
    assert ids(server_events) == {"from-server"}
    for events in (gui_events, server_events):
        assert sum(isinstance(e, ModelLoaded) for e in events) == 1  # a new model concerns everyone
        assert any(isinstance(e, StatusChanged) and e.state == "ready" for e in events)


def test_a_late_listener_learns_the_loaded_model_and_status_at_once() -> None:
    hub = EngineHub(_EchoRuntime)
    first: queue.Queue = queue.Queue()
    hub.listen(first.put)
    hub.start()
    try:
        hub.submit(LoadModel("load", "x"), first.put)
        _collect(first, StatusChanged)
        late: queue.Queue = queue.Queue()
        hub.listen(late.put)
        replayed = [late.get(timeout=1), late.get(timeout=1)]
    finally:
        hub.stop()

    assert isinstance(replayed[0], ModelLoaded) and replayed[0].name == "echo"
    assert isinstance(replayed[1], StatusChanged) and replayed[1].state == "ready"


def test_a_listener_that_leaves_takes_its_requests_events_with_it() -> None:
    hub = EngineHub(_EchoRuntime)
    gui, server = queue.Queue(), queue.Queue()
    hub.listen(gui.put)
    hub.listen(server.put)
    hub.submit(Generate("from-server", "c2", ()), server.put)  # queued before the engine thread starts
    hub.unlisten(server.put)
    hub.start()
    try:
        hub.submit(Generate("from-gui", "c1", ()), gui.put)
        gui_events = _collect(gui, ReplyFinished)
    finally:
        hub.stop()

    assert [e.request_id for e in gui_events if isinstance(e, (TokenStreamed, ReplyFinished))] == ["from-gui"] * 2
    assert server.empty()
