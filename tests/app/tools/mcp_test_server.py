"""A tiny MCP server for the tool tests, run as a child process over stdio (``python mcp_test_server.py``).

Built with the SDK's ``MCPServer`` (mcp 1's ``FastMCP``). It appends its process id to the
file named by ``HEARTH_TEST_PID_FILE`` when it starts, so the tests can see it stopped.
With ``HEARTH_TEST_HTTP_PORT`` set it serves streamable HTTP at ``http://127.0.0.1:PORT/mcp`` instead.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("hearth-test")


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return f"{a + b:g}"


@server.tool()
def fail(message: str) -> str:
    """Fail with the message given."""
    raise ToolError(message)


@server.tool()
async def sleep_forever() -> str:
    """Never return."""
    await asyncio.Event().wait()
    return "woke up"


@server.tool()
def crash() -> str:
    """End the server's process in the middle of the call."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    with open(os.environ["HEARTH_TEST_PID_FILE"], "a", encoding="utf-8") as pid_file:
        pid_file.write(f"{os.getpid()}\n")
    http_port = os.environ.get("HEARTH_TEST_HTTP_PORT")
    if http_port:
        server.run("streamable-http", port=int(http_port))
    else:
        server.run()
