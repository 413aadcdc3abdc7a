"""What a server link hands back to the hub, free of the ``mcp`` SDK's types (GUI thread)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ListedTool:
    """A tool as its server lists it; ``input_schema`` is its JSON Schema as JSON text."""

    name: str
    description: str
    input_schema: str


@dataclass(frozen=True)
class ToolReply:
    """A tool's result as text; ``is_error`` when the tool itself reported a failure (MCP ``isError``)."""

    is_error: bool
    text: str


class ServerProblem(Exception):
    """Why a server could not be reached or did not answer, as a sentence for the user.

    ``connection_lost``: the connection is unusable (the server stopped, the transport broke),
    so the next call must connect again.
    """

    def __init__(self, message: str, connection_lost: bool = True) -> None:
        super().__init__(message)
        self.connection_lost = connection_lost
