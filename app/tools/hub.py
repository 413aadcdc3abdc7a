"""The chat's way to MCP tools: every enabled server of Settings › Tools, behind one ``ToolHub`` (GUI thread).

``ToolHub`` runs on the qasync loop and never blocks it. It connects to a server the
first time its tools are asked for, keeps the connection, and lists the tools of all
enabled servers as ``ToolSpec``s whose ``function_name``s are unique across servers.
``call`` never raises: a tool's own failure, a server that stops, refuses or hangs all
come back as a ``ToolOutcome`` saying so; a server that fails or hangs is stopped, and
the next call starts it again. A server that could not be reached is named in
``problems()`` and tried again by ``tools()`` after ``RETRY_AFTER_S`` (at once by a call,
or when its settings change). "Always allow" is saved per tool in the server's entry of
the settings (``ToolServerConfig.always_allowed``).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import time
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from app.settings.app_settings import SettingsHolder
from app.storage.settings import Settings, ToolServerConfig
from app.tools.naming import function_names
from app.tools.results import ListedTool, ServerProblem

if TYPE_CHECKING:
    from app.tools.link import ServerLink

CONNECT_TIMEOUT_S = 30.0  # a first `npx` or `uvx` start may download the server
RETRY_AFTER_S = 60.0
STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown of a server is bounded by about 6.5 s
LINK_MODULE = "app.tools.link"


@dataclass(frozen=True)
class ToolSpec:
    """A tool of an enabled server, as the model is offered it."""

    server: str  # the MCP server's name as the user gave it in Settings › Tools
    name: str  # the tool's name on that server
    function_name: str  # the name the model sees (unique across servers)
    description: str
    input_schema: str  # the tool's JSON Schema, as JSON text

    def openai_json(self) -> str:
        """The tool as an OpenAI function tool, JSON text (what ``Generate.tools`` holds)."""
        function = {"name": self.function_name, "description": self.description, "parameters": json.loads(self.input_schema)}
        return json.dumps({"type": "function", "function": function}, ensure_ascii=False)


@dataclass(frozen=True)
class ToolOutcome:
    """How a call ended: ``text`` is the result's text, or a clear message of what went wrong."""

    status: Literal["done", "error", "timeout"]
    text: str
    seconds: float


class ToolHub:
    """The tools of the servers in ``holder``'s settings (GUI thread; coroutines on the qasync loop)."""

    def __init__(self, holder: SettingsHolder, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._settings = holder
        self._connect_timeout_s = connect_timeout_s
        self._links: dict[str, ServerLink] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._problems: dict[str, str] = {}
        self._failed_at: dict[str, float] = {}
        self._tried: dict[str, ToolServerConfig] = {}
        """The connection part (``_connection_of``) of each server's entry when it was last connected or tried."""
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        holder.changed.connect(self._follow_settings)

    async def tools(self) -> tuple[ToolSpec, ...]:
        """The tools of every enabled server, connecting to those not connected yet (concurrently)."""
        enabled = [config for config in self._settings.settings.tool_servers if config.enabled]
        links = await asyncio.gather(*(self._link_for(config, self._connect_timeout_s, False) for config in enabled))
        listed = [(link.config.name, tool) for link in links if link is not None for tool in link.tools]
        names = function_names([(server, tool.name) for server, tool in listed])
        return tuple(_spec(server, tool, name) for (server, tool), name in zip(listed, names))

    def problems(self) -> tuple[str, ...]:
        """Why each enabled server that could not be reached was not, one sentence each."""
        return tuple(self._problems.values())

    async def call(self, tool: ToolSpec, arguments: dict, timeout_s: float) -> ToolOutcome:
        """Call ``tool``, connecting first if needed; never raises, returns within about ``timeout_s``."""
        started = time.monotonic()
        attempt = asyncio.ensure_future(self._call_once(tool, arguments, timeout_s))
        try:
            done, _pending = await asyncio.wait({attempt}, timeout=timeout_s)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        if done:
            status, text = attempt.result()
        else:
            attempt.cancel()  # not awaited: a hung server may hold it; the link's stop ends it
            self._drop(tool.server)
            status, text = "timeout", (
                f"The tool “{tool.name}” of “{tool.server}” did not finish within {timeout_s:g} s, so Hearth "
                "closed the connection (stopping the server if Hearth started it). The next call connects again."
            )
        return ToolOutcome(status, text, time.monotonic() - started)

    def always_allowed(self, tool: ToolSpec) -> bool:
        config = self._config(tool.server)
        return config is not None and tool.name in config.always_allowed

    def allow_always(self, tool: ToolSpec) -> None:
        """Run ``tool`` without asking from now on (saved); raises ``StorageError`` if the settings cannot be saved."""
        self._settings.replace(self._settings.settings.with_tool_allowed(tool.server, tool.name))

    async def close(self) -> None:
        """Disconnect from every server and wait (bounded) until their processes are gone."""
        self._closed = True
        for name in list(self._links):
            self._drop(name)
        if self._stopping:
            await asyncio.wait(self._stopping, timeout=STOP_TIMEOUT_S)

    async def _call_once(self, tool: ToolSpec, arguments: dict[str, Any], timeout_s: float) -> tuple[str, str]:
        config = self._config(tool.server)
        if config is None or not config.enabled:
            return "error", f"The tool server “{tool.server}” is no longer enabled in Settings › Tools."
        link = await self._link_for(config, min(timeout_s, self._connect_timeout_s), True)
        if link is None:
            return "error", self._problems.get(config.name, f"The tool server “{config.name}” is not connected.")
        try:
            reply = await link.call(tool.name, arguments)
        except ServerProblem as problem:
            if problem.connection_lost:
                self._drop(config.name)
            return "error", str(problem)
        return ("error" if reply.is_error else "done"), reply.text

    async def _link_for(self, config: ToolServerConfig, timeout_s: float, retry_now: bool) -> ServerLink | None:
        """The open link to ``config``'s server, connecting if needed; None (and a problem) if that fails.

        A server that failed is tried again only after ``RETRY_AFTER_S``, unless ``retry_now``.
        """
        async with self._locks.setdefault(config.name, asyncio.Lock()):
            link = self._links.get(config.name)
            if link is not None and link.alive:
                return link
            self._drop(config.name)  # a link the server ended: ``close`` still waits for its process
            waited = time.monotonic() - self._failed_at.get(config.name, -RETRY_AFTER_S)
            if self._closed or (not retry_now and waited < RETRY_AFTER_S):
                return None
            connection = _connection_of(config)
            self._tried[config.name] = connection
            try:
                link = await _open_link(config, timeout_s)
            except ServerProblem as problem:
                if self._tried.get(config.name) == connection:  # else its settings changed meanwhile
                    self._problems[config.name], self._failed_at[config.name] = str(problem), time.monotonic()
                return None
            self._problems.pop(config.name, None)
            self._failed_at.pop(config.name, None)
            self._links[config.name] = link
            if self._closed or self._tried.get(config.name) != connection:
                self._drop(config.name)
                return None
            return link

    def _config(self, server: str) -> ToolServerConfig | None:
        return next((config for config in self._settings.settings.tool_servers if config.name == server), None)

    def _drop(self, server: str) -> None:
        """Stop the link to ``server`` in the background (``close`` waits for it)."""
        link = self._links.pop(server, None)
        if link is None:
            return
        stopping = link.stop()
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    def _follow_settings(self, settings: Settings) -> None:
        """Drop the links and problems of servers that were removed, turned off or changed."""
        configs = {config.name: _connection_of(config) for config in settings.tool_servers if config.enabled}
        for name, tried in list(self._tried.items()):
            if configs.get(name) != tried:
                self._drop(name)
                del self._tried[name]
                self._problems.pop(name, None)
                self._failed_at.pop(name, None)


async def check_server(config: ToolServerConfig, timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[ListedTool, ...]:
    """Connect to ``config``'s server, list its tools and disconnect (Settings › Tools › Test).

    Raises ``ServerProblem`` saying why when it cannot be reached.
    """
    link = await _open_link(config, timeout_s)
    await link.stop()
    return link.tools


async def _open_link(config: ToolServerConfig, timeout_s: float) -> ServerLink:
    """Open a link; the SDK is imported on a worker thread the first time, so the window stays responsive."""
    link_module = await asyncio.to_thread(_import_without_collecting, LINK_MODULE)
    return await link_module.ServerLink.open(config, timeout_s)


def _import_without_collecting(name: str) -> ModuleType:
    """Import ``name`` with automatic garbage collection paused (worker thread).

    An import allocates enough to start collections on the thread that imports, and a
    collection there could destroy garbage Qt objects of the GUI thread, which crashes Qt.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(name)
    finally:
        if collecting:
            gc.enable()


def _spec(server: str, tool: ListedTool, function_name: str) -> ToolSpec:
    return ToolSpec(server, tool.name, function_name, tool.description, tool.input_schema)


def _connection_of(config: ToolServerConfig) -> ToolServerConfig:
    """The parts of a server's entry that its connection depends on."""
    return replace(config, always_allowed=(), enabled=True)
