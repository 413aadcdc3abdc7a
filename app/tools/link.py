"""One live connection to an MCP server through the ``mcp`` SDK (GUI thread, qasync loop).

The SDK's transports and sessions are anyio task groups that the same task must enter
and leave, so each ``ServerLink`` runs a holder task: it starts the server
(``stdio_client``) or reaches it (``streamable_http_client``) under an SDK ``Client``,
lists the tools, and keeps the connection open until ``stop`` or until the server ends
the connection (it exited, or the HTTP stream closed: ``_EndWatch`` sees the end of what
it sends). Calls from other tasks go through the open ``Client``. Stopping ends the
holder: the SDK closes the server's stdin, then terminates and at last kills its
process tree, every wait bounded.

Importing this module loads the SDK (about a second), so ``app.tools.hub`` imports it
on a worker thread the first time a server is needed.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TextIO

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, EmbeddedResource, TextContent, TextResourceContents

from app.storage.settings import ToolServerConfig
from app.tools.results import ListedTool, ServerProblem, ToolReply

STDERR_TAIL_CHARS = 800
MAX_TOOL_PAGES = 100


class ServerLink:
    """An open connection to one server; make it with ``await ServerLink.open(config, timeout_s)``."""

    def __init__(self, config: ToolServerConfig) -> None:
        self.config = config
        self.tools: tuple[ListedTool, ...] = ()
        self._client: Client | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._errlog: TextIO | None = _stderr_file() if config.transport == "stdio" else None
        self._holder = asyncio.ensure_future(self._hold())

    @classmethod
    async def open(cls, config: ToolServerConfig, timeout_s: float) -> ServerLink:
        """Connect and list the tools; raises ``ServerProblem`` if that fails or takes over ``timeout_s``."""
        link = cls(config)
        try:
            await asyncio.wait_for(asyncio.shield(link._ready), timeout_s)
        except asyncio.TimeoutError:
            problem = ServerProblem(f"{_named(config)} did not answer within {timeout_s:g} s.{link._stderr_tail()}")
            link.stop()
            raise problem from None
        except BaseException:
            link.stop()
            raise
        return link

    @property
    def alive(self) -> bool:
        """Connected, not asked to stop, and the server has not ended the connection."""
        return self._client is not None and not self._stop.is_set()

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolReply:
        """Call ``tool``; raises ``ServerProblem`` when the server refuses the call or the connection breaks."""
        try:
            result = await self._connected().call_tool(tool, arguments)
        except MCPError as error:
            if error.code == CONNECTION_CLOSED:
                raise ServerProblem(f"{_named(self.config)} stopped during the call.{self._stderr_tail()}") from error
            raise ServerProblem(f"{_named(self.config)} refused the call: {error.message}", False) from error
        except Exception as error:
            raise ServerProblem(f"{_named(self.config)} failed during the call: {_describe(error)}") from error
        return ToolReply(result.is_error, _result_text(result))

    def stop(self) -> asyncio.Task[None]:
        """Close the connection and stop the server; the returned task ends once it is gone (bounded by the SDK)."""
        if self._client is None:
            self._holder.cancel()  # still connecting: nothing to close gracefully
        self._stop.set()
        if self._errlog is not None:  # kept open until now: a call's failure may quote it after the server ended
            self._holder.add_done_callback(lambda _holder: self._errlog.close())
        return self._holder

    def _connected(self) -> Client:
        if self._client is None or self._stop.is_set():
            raise ServerProblem(f"{_named(self.config)} is not connected.")
        return self._client

    async def _hold(self) -> None:
        """Open the connection, list the tools, report ready, and keep it open until ``stop``."""
        try:
            async with Client(_watched(self._transport(), self._stop)) as client:
                self.tools = await _list_tools(client)
                self._client = client
                if not self._ready.done():
                    self._ready.set_result(None)
                await self._stop.wait()
        except Exception as error:
            if not self._ready.done():
                self._ready.set_exception(ServerProblem(self._connect_problem(error)))
        finally:
            self._client = None

    def _transport(self) -> AbstractAsyncContextManager:
        if self.config.transport == "http":
            return streamable_http_client(self.config.url)
        parameters = StdioServerParameters(
            command=self.config.command, args=list(self.config.args), env=dict(self.config.env) or None
        )
        return stdio_client(parameters, errlog=self._errlog)

    def _connect_problem(self, error: Exception) -> str:
        cause = _innermost(error)
        if isinstance(cause, FileNotFoundError) and self.config.transport == "stdio":
            return (
                f'{_named(self.config)} could not start: the command "{self.config.command}" was not found. '
                "Is it installed, and on the PATH?"
            )
        if isinstance(cause, PermissionError) and self.config.transport == "stdio":
            return f'{_named(self.config)} could not start: the command "{self.config.command}" may not be run.'
        if isinstance(cause, MCPError) and cause.code == CONNECTION_CLOSED:
            return f"{_named(self.config)} stopped before it answered.{self._stderr_tail()}"
        where = f" at {self.config.url}" if self.config.transport == "http" else ""
        return f"{_named(self.config)} could not be reached{where}: {_describe(cause)}.{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        """The end of what the server wrote to stderr, as a sentence to append ("" when nothing)."""
        if self._errlog is None or self._errlog.closed:
            return ""
        self._errlog.seek(0, 2)
        size = self._errlog.tell()
        self._errlog.seek(max(0, size - STDERR_TAIL_CHARS))
        tail = self._errlog.read().strip()
        return f" It wrote: {tail}" if tail else ""


@asynccontextmanager
async def _watched(transport: AbstractAsyncContextManager, ended: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
    """``transport`` whose read stream sets ``ended`` when the server ends the connection."""
    async with transport as (read_stream, write_stream):
        yield _EndWatch(read_stream, ended), write_stream


class _EndWatch:
    """A transport's read stream, as the SDK's dispatcher reads it, that sets ``ended`` at its end."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream = stream
        self._ended = ended

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def __aenter__(self) -> _EndWatch:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        return await self._stream.__aexit__(*exc_info)

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except BaseException:
            self._ended.set()
            raise


def _stderr_file() -> TextIO:
    """Where a started server's stderr goes, so that a failure can quote it (deleted when closed)."""
    return tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")


def _named(config: ToolServerConfig) -> str:
    return f"The tool server “{config.name}”"


async def _list_tools(client: Client) -> tuple[ListedTool, ...]:
    listed: list[ListedTool] = []
    cursor: str | None = None
    for _page in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        listed += [ListedTool(tool.name, tool.description or "", json.dumps(tool.input_schema)) for tool in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            break
    return tuple(listed)


def _result_text(result: CallToolResult) -> str:
    """The result's content as text: texts as they are, other content named in brackets."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return "\n".join(parts)


def _block_text(block: object) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource) and isinstance(block.resource, TextResourceContents):
        return block.resource.text
    kind = getattr(block, "type", "content")
    detail = getattr(block, "mime_type", None) or getattr(block, "uri", None) or ""
    return f"[{kind}{': ' if detail else ''}{detail}]"


def _innermost(error: BaseException) -> BaseException:
    """The first leaf of nested exception groups (anyio task groups wrap what went wrong)."""
    inner = getattr(error, "exceptions", None)  # an exception group, or its backport on Python 3.10
    return _innermost(inner[0]) if inner else error


def _describe(error: BaseException) -> str:
    cause = _innermost(error)
    return str(cause) or type(cause).__name__
