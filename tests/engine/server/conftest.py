"""API server fixtures: a real engine thread (``EngineHub``) with the tiny model, and Hearth's server on a
free loopback port, shared by a module's tests (test thread + engine thread + server thread)."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

import pytest

from engine.api.server.config import ServerConfig
from engine.api.server.server import ApiServer
from engine.protocol.messages import Cancel, Generate, LoadModel, ModelLoaded, Request
from engine.service.fanout import EngineHub
from tests.engine.server.scripted_engine import serve_scripted


class RecordingHub(EngineHub):
    """An ``EngineHub`` that remembers every request submitted to it (to see the server's ``Cancel``)."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: queue.Queue[Request] = queue.Queue()

    def submit(self, request, owner=None) -> None:
        self.submitted.put(request)
        super().submit(request, owner)

    def forget_submitted(self) -> None:
        while not self.submitted.empty():
            self.submitted.get_nowait()

    def wait_for_cancel(self, timeout_s: float = 10.0) -> tuple[str, str]:
        """The ids of the last ``Generate`` seen and of the first ``Cancel`` after it."""
        generate_id = ""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                request = self.submitted.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if isinstance(request, Generate):
                generate_id = request.request_id
            elif isinstance(request, Cancel):
                return generate_id, request.request_id
        raise AssertionError("the server sent no Cancel to the engine")


@dataclass
class Served:
    hub: RecordingHub
    server: ApiServer
    model_id: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def root(self) -> str:
        return self.server.url.removesuffix("/v1")

    def start_another(self, config: ServerConfig) -> ApiServer:
        server = ApiServer(self.hub, config)
        server.start()
        return server


def serve(path: str, config: ServerConfig):
    hub = RecordingHub()
    hub.start()
    loaded = hub.load_and_wait(LoadModel("fixture-load", path), timeout=300)
    assert isinstance(loaded, ModelLoaded), loaded.message
    server = ApiServer(hub, config)
    server.start()
    try:
        yield Served(hub, server, loaded.name)
    finally:
        server.stop()
        hub.stop()


@pytest.fixture(scope="module")
def served_tiny(tiny_model_dir):
    yield from serve(str(tiny_model_dir), ServerConfig(port=0))


@pytest.fixture(scope="module")
def served_default(default_model_path):
    yield from serve(str(default_model_path), ServerConfig(port=0))


@pytest.fixture(scope="module")
def scripted():
    """A server over the scripted engine (``scripted_engine``) of a Hermes-style model, per module: (hub, server)."""
    with serve_scripted("hermes") as pair:
        yield pair
