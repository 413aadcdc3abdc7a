"""The asyncio side of the engine: submit requests, await events.

``AsyncEngine`` is created and used on the thread that runs the asyncio loop (the
GUI thread under qasync, or the CLI's main thread). Events are handed over from
the engine thread with ``loop.call_soon_threadsafe``, so the loop never blocks.
It is one listener of an ``EngineHub``; ``hub`` lets another listener (the API
server) share the same engine thread.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from engine.protocol.messages import Event, Request
from engine.service.fanout import EngineHub
from engine.service.worker import RuntimeFactory, _default_runtime


class AsyncEngine:
    """An engine thread whose events (those of its own requests, and the global ones) arrive on an asyncio queue."""

    def __init__(self, runtime_factory: RuntimeFactory = _default_runtime) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.hub = EngineHub(runtime_factory)
        self.hub.listen(self._hand_over)
        self.hub.start()

    def _hand_over(self, event: Event) -> None:
        """Runs on the engine thread."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    def submit(self, request: Request) -> None:
        self.hub.submit(request, self._hand_over)

    async def next_event(self) -> Event:
        return await self._events.get()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            yield await self._events.get()

    def close(self, timeout: float | None = 10.0) -> None:
        self.hub.stop(timeout)
