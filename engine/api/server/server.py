"""The API server: Starlette routes served by uvicorn on a thread and asyncio loop of its own.

Why Starlette and uvicorn: they are what vLLM's and llama-cpp-python's servers stand
on (FastAPI is Starlette underneath), both are small and well kept, and Starlette
alone is enough here: the request bodies are validated by hand in
``openai_schema`` so every refusal gets OpenAI's error shape, which FastAPI's
automatic 422 replies would not give.

``ApiServer.launch``/``start``/``stop`` are called from any thread (the CLI's main
thread, the GUI thread); the routes and ``EngineLink`` run on the server thread, on a
plain asyncio loop of its own: never the policy's loop, which in the window is
qasync's Qt loop and cannot run off the GUI thread. The socket is bound in
``launch`` itself, so a port in use fails there with a clear message, and port 0
picks a free one (``port`` tells which). ``launch`` returns at once and
``on_serving`` says later whether serving began (the window must not block);
``start`` waits for that (the CLI). Whatever ends the server thread, the socket is
closed, so a failed start never leaves the port listening.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from dataclasses import replace

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from engine.api.server.access import AccessGuard
from engine.api.server.anthropic_messages import messages
from engine.api.server.config import ServerConfig
from engine.api.server.completions import chat_completions, completions
from engine.api.server.engine_link import EngineLink, OnActivity
from engine.api.server.errors import HANDLERS
from engine.api.server.metrics import ServerMetrics
from engine.api.server.openai_schema import default_max_tokens
from engine.api.server.slow_clients import KEEP_ALIVE_S, HeaderDeadlineProtocol
from engine.service.fanout import EngineHub

START_TIMEOUT_S = 10.0
STARTUP_POLL_S = 0.01
GRACEFUL_SHUTDOWN_S = 2
BACKLOG = 128


async def health(request: Request) -> Response:
    link: EngineLink = request.app.state.link
    if link.model is not None and link.state in ("ready", "generating"):
        return JSONResponse({"status": "ok", "model": link.model.name})
    status = "loading" if link.state in ("loading", "fetching") else "unavailable"
    return JSONResponse({"status": status}, status_code=503)


async def metrics(request: Request) -> Response:
    return PlainTextResponse(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    """The model served; ``context_length`` and ``max_model_len`` (vLLM's name) tell clients the context window
    it was loaded with and ``context_reason`` why it is that long ("4 096 of 131 072 tokens, as asked"),
    ``max_tokens_default`` how long a reply is when a request sets no ``max_tokens``, ``kv_cache`` its KV cache's
    precision ("bf16", "int8", …)."""
    link: EngineLink = request.app.state.link
    model = link.model
    listed = [] if model is None else [{
        "id": model.name, "object": "model", "created": 0, "owned_by": "hearth",
        "context_length": model.context_length, "max_model_len": model.context_length,
        "context_reason": model.context_reason,
        "max_tokens_default": default_max_tokens(model.context_length), "kv_cache": model.kv_cache,
    }]
    return JSONResponse({"object": "list", "data": listed})


def build_app(config: ServerConfig, link: EngineLink, figures: ServerMetrics) -> Starlette:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
    ]
    middleware = [Middleware(AccessGuard, config=config)]
    if config.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Api-Key", "Anthropic-Version", "Anthropic-Beta"],
        ))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=HANDLERS)  # type: ignore[arg-type]
    app.state.config, app.state.link, app.state.metrics = config, link, figures
    return app


OnServing = Callable[[str | None], None]
"""Called once on the server thread: None when serving began, else why it could not."""


class ApiServer:
    """Serves ``hub``'s engine over HTTP until ``stop``; ``on_activity`` hears of each request (server thread)."""

    def __init__(self, hub: EngineHub, config: ServerConfig, on_activity: OnActivity | None = None,
                 on_serving: OnServing | None = None) -> None:
        config.check()
        self.config = config
        self._hub = hub
        self._on_activity = on_activity
        self._on_serving = on_serving
        self._socket: socket.socket | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._stop_requested = False
        self._start_failure: str | None = None
        self._started = threading.Event()
        """Set once serving began or could not (``_start_failure`` says why)."""
        self._thread = threading.Thread(target=self._run, name="hearth-api", daemon=True)

    @property
    def url(self) -> str:
        return self.config.url

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """``launch``, then wait until serving; ``OSError`` when it cannot bind, fails or takes over ``timeout``."""
        self.launch()
        if not self._started.wait(timeout):
            self.stop()
            raise OSError("The API server did not start in time.")
        if self._start_failure is not None:
            raise OSError(self._start_failure)

    def launch(self) -> None:
        """Bind and start the server thread without waiting; ``on_serving`` tells how starting went.

        ``OSError`` (port in use, say) comes from here, before any thread starts.
        """
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.host, self.config.port))
            sock.listen(BACKLOG)  # clients may connect at once: the kernel queues them until uvicorn accepts
        except OSError as exc:
            sock.close()
            raise OSError(f"Cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}.") from None
        self._socket = sock
        self.config = replace(self.config, port=sock.getsockname()[1])
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the server to finish its requests and end; wait up to ``timeout`` for its thread."""
        self._stop_requested = True  # read by _serve, for a stop that comes before uvicorn exists
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        """The server thread: serve on a plain asyncio loop; always close the socket and report a failed start."""
        failure = "The API server stopped before it began serving."
        try:
            with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
                runner.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - uvicorn ends a failed startup with SystemExit
            failure = f"The API server could not start: {exc!r}"
        finally:
            assert self._socket is not None
            self._socket.close()
            self._report_start(failure)

    def _report_start(self, failure: str | None) -> None:
        """Tell ``on_serving`` the first time only (server thread)."""
        if self._started.is_set():
            return
        self._start_failure = failure
        self._started.set()
        if self._on_serving is not None:
            self._on_serving(failure)

    async def _serve(self) -> None:
        figures = ServerMetrics()
        link = EngineLink(self._hub, figures, self._on_activity)
        link.attach()
        app = build_app(self.config, link, figures)
        settings = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            http=HeaderDeadlineProtocol, timeout_keep_alive=KEEP_ALIVE_S,
        )
        server = uvicorn.Server(settings)
        self._uvicorn = server
        server.should_exit = self._stop_requested
        serving = asyncio.create_task(server.serve(sockets=[self._socket]))
        try:
            while not (server.started or serving.done()):
                await asyncio.sleep(STARTUP_POLL_S)
            if server.started:
                self._report_start(None)
            await serving
        finally:
            link.detach()
