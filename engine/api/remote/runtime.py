"""A ``Runtime`` whose model runs on a remote OpenAI-compatible server (engine thread).

Run it by its own engine thread: ``AsyncEngine(RemoteRuntime)``. It answers the
same requests with the same events as the embedded runtime, so the GUI does not
care which one answers: ``ListRemoteModels`` asks the server's ``GET /v1/models``;
``LoadModel`` with a ``server`` checks that the server still lists the model and
then emits ``ModelLoaded`` (nothing is loaded here: the server holds the model);
``Generate`` streams a reply from it (``reply``), and ``Cancel`` closes that
stream. The server keeps its own caches, so ``ForgetConversation`` has nothing to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

from engine.api.remote.openai_stream import MODELS_PATH, listed_models
from engine.api.remote.http_stream import RemoteError, get_json, never_cancelled, normalize_base_url
from engine.api.remote.watched_socket import Cancelled
from engine.api.remote.reply import RemoteReply
from engine.protocol.channels import CancelWatch, EventSink
from engine.service.worker import ServesWhole
from engine.protocol.messages import (
    Cancel,
    Generate,
    InspectFailed,
    InspectModel,
    ListRemoteModels,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    RemoteModelsFailed,
    RemoteModelsListed,
    RemoteServer,
    ReplyFailed,
    Request,
    StatusChanged,
)

REMOTE_PRECISION = "remote"
CONNECT_CANCELLED = "Connecting was cancelled; the model in use stays."
MODELS_SHOWN_IN_ERRORS = 8


class RemoteRuntime(ServesWhole):
    """Holds the chosen remote model (a server and a model id); one request at a time, each served whole:
    other requests wait for a reply to end, while a ``Cancel`` reaches it between two of its chunks."""

    def __init__(self, emit: EventSink, watch: CancelWatch) -> None:
        self._emit = emit
        self._watch = watch
        self._server: RemoteServer | None = None
        self._model = ""
        self._context_length = 0

    def handle(self, request: Request) -> None:
        if isinstance(request, ListRemoteModels):
            self._list(request)
        elif isinstance(request, LoadModel):
            self._load(request)
        elif isinstance(request, Generate):
            self._generate(request)
        elif isinstance(request, Cancel):
            self._watch.forget(request.request_id)  # it came after its request ended
        elif isinstance(request, InspectModel):
            self._emit(InspectFailed(request.request_id, "Models on a remote server are not inspected here."))

    def idle(self) -> None:
        """The memory in use is the server's: nothing to sample here."""

    def close(self) -> None:
        """Nothing is held open between requests."""

    def _list(self, request: ListRemoteModels) -> None:
        try:
            server = _normalized(request.server)
            models = _server_models(server)
        except RemoteError as error:
            self._emit(RemoteModelsFailed(request.request_id, str(error)))
            return
        self._emit(RemoteModelsListed(request.request_id, server.base_url, tuple(models)))

    def _load(self, request: LoadModel) -> None:
        if request.server is None:
            self._emit(LoadFailed(request.request_id, "This engine runs only models on a remote server."))
            return
        started = time.perf_counter()
        self._emit(StatusChanged("loading", f"{request.path} on {request.server.base_url}"))
        try:
            server = _normalized(request.server)
            models = _server_models(server, lambda: self._watch.is_cancelled(request.request_id))
            if request.path not in models:
                raise RemoteError(_missing_model_message(server.base_url, request.path, models))
        except RemoteError as error:
            self._fail_load(request, str(error))
            return
        except Cancelled:
            self._fail_load(request, CONNECT_CANCELLED)
            return
        if self._watch.is_cancelled(request.request_id):  # the Cancel came as the server answered
            self._fail_load(request, CONNECT_CANCELLED)
            return
        self._watch.forget(request.request_id)
        self._server, self._model, self._context_length = server, request.path, models[request.path]
        self._emit(ModelLoaded(
            request.request_id, request.path, request.path, urlsplit(server.base_url).netloc, REMOTE_PRECISION,
            self._context_length, time.perf_counter() - started, server=server.base_url,
        ))
        self._emit_ready()

    def _fail_load(self, request: LoadModel, message: str) -> None:
        """The remote model in use, if any, stays."""
        self._watch.forget(request.request_id)
        self._emit(LoadFailed(request.request_id, message))
        self._emit_ready()

    def _generate(self, request: Generate) -> None:
        server = self._server
        if server is None:
            self._emit(ReplyFailed(request.request_id, "No remote model is chosen yet: use File › Connect to server…."))
            return
        self._emit(StatusChanged("generating", f"{self._model} on {server.base_url}"))
        try:
            RemoteReply(self._emit, request, server, self._model, self._context_length).run(
                lambda: self._watch.is_cancelled(request.request_id)
            )
        finally:
            self._watch.forget(request.request_id)
        self._emit_ready()

    def _emit_ready(self) -> None:
        if self._server is None:
            self._emit(StatusChanged("idle", "No remote model chosen"))
        else:
            self._emit(StatusChanged("ready", f"{self._model} on {self._server.base_url} (remote)"))


def _normalized(server: RemoteServer) -> RemoteServer:
    try:
        return replace(server, base_url=normalize_base_url(server.base_url))
    except ValueError as error:
        raise RemoteError(str(error)) from None


def _server_models(server: RemoteServer, is_cancelled: Callable[[], bool] = never_cancelled) -> dict[str, int]:
    return listed_models(server.base_url, get_json(server, MODELS_PATH, is_cancelled))


def _missing_model_message(base_url: str, model: str, models: dict[str, int]) -> str:
    names = ", ".join(list(models)[:MODELS_SHOWN_IN_ERRORS]) or "no models at all"
    more = f" and {len(models) - MODELS_SHOWN_IN_ERRORS} more" if len(models) > MODELS_SHOWN_IN_ERRORS else ""
    return f'The server at {base_url} does not run a model called "{model}"; it lists {names}{more}.'
