"""A stand-in for ``app.tools.hub.ToolHub`` (same contract, no MCP servers) for the chat's tool tests.

Its tools answer from a table: a function of the arguments, an error, a call that never ends
(it times out at the ``timeout_s`` the chat gives), or one that hangs until cancelled.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Behaviour = Callable[[dict], str] | Literal["error", "timeout", "hang"]


@dataclass(frozen=True)
class StandInSpec:
    """The shape of ``app.tools.hub.ToolSpec``."""

    server: str
    name: str
    function_name: str
    description: str
    input_schema: str

    def openai_json(self) -> str:
        function = {"name": self.function_name, "description": self.description, "parameters": json.loads(self.input_schema)}
        return json.dumps({"type": "function", "function": function})


@dataclass(frozen=True)
class StandInOutcome:
    """The shape of ``app.tools.hub.ToolOutcome``."""

    status: Literal["done", "error", "timeout"]
    text: str
    seconds: float


def spec(name: str, server: str = "weather") -> StandInSpec:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return StandInSpec(server, name, name, f"The {name} tool.", json.dumps(schema))


@dataclass
class StandInHub:
    behaviours: dict[str, Behaviour]
    """What each tool (by function name) does when called."""
    always: set[str] = field(default_factory=set)
    calls: list[tuple[str, dict, float]] = field(default_factory=list)
    """Every call: function name, arguments, timeout."""
    cancelled: list[str] = field(default_factory=list)
    """The calls that were cancelled while they ran."""
    listed: asyncio.Event | None = None
    """Where set, ``tools`` answers once it is (servers still starting)."""

    async def tools(self) -> tuple[StandInSpec, ...]:
        if self.listed is not None:
            await self.listed.wait()
        return tuple(spec(name) for name in self.behaviours)

    def problems(self) -> tuple[str, ...]:
        return ()

    async def call(self, tool: StandInSpec, arguments: dict, timeout_s: float) -> StandInOutcome:
        self.calls.append((tool.function_name, arguments, timeout_s))
        behaviour = self.behaviours[tool.function_name]
        started = time.monotonic()
        if behaviour == "error":
            return StandInOutcome("error", "The weather service said: 503 Service Unavailable", 0.01)
        if behaviour in ("timeout", "hang"):
            try:
                await asyncio.wait_for(asyncio.sleep(3600), None if behaviour == "hang" else timeout_s)
            except asyncio.TimeoutError:
                return StandInOutcome("timeout", f"The tool did not answer within {timeout_s:g} s.", timeout_s)
            except asyncio.CancelledError:
                self.cancelled.append(tool.function_name)
                raise
        return StandInOutcome("done", behaviour(arguments), time.monotonic() - started)

    def always_allowed(self, tool: StandInSpec) -> bool:
        return tool.function_name in self.always

    def allow_always(self, tool: StandInSpec) -> None:
        self.always.add(tool.function_name)

    async def close(self) -> None:
        """Nothing to close."""
