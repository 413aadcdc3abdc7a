"""A Hearth window whose fake model never stops writing: the target of the kill -9 test (GUI thread).

Run as a script with HEARTH_HOME set. It sends one message, waits until the reply has streamed
for ``STREAM_S`` seconds (so at least one checkpoint happened), prints the length shown so far
on stdout, and keeps streaming until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
import time

import qasync
from PySide6.QtWidgets import QApplication

from app.controller import EngineController
from app.window.main_window import MainWindow
from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import Generate, LoadModel, ModelLoaded, Request, TokenStreamed
from engine.service.client import AsyncEngine

STREAM_S = 1.6
QUESTION = "Tell me everything"


class EndlessRuntime:
    """Loads instantly and answers every Generate with words, forever."""

    def __init__(self, emit: EventSink, _watch: CancelWatch) -> None:
        self._emit = emit

    def handle(self, request: Request) -> None:
        if isinstance(request, LoadModel):
            self._emit(ModelLoaded(request.request_id, "Endless", request.path, "cpu", "fp32", 2048, 0.0))
        elif isinstance(request, Generate):
            count = 0
            while True:
                time.sleep(0.005)
                self._emit(TokenStreamed(request.request_id, f"word{count} ", count + 1, 200.0, time.time()))
                count += 1

    def idle(self) -> None:
        """Nothing to sample."""

    def close(self) -> None:
        """Never reached: the process is killed."""


async def stream_until_killed() -> None:
    controller = EngineController()
    window = MainWindow(controller)
    window.show()
    controller.start(AsyncEngine(EndlessRuntime))
    window.session.load_model("endless")
    while not window.session.send(QUESTION):
        await asyncio.sleep(0.02)
    await asyncio.sleep(STREAM_S)
    print(len(window.session.conversation.messages[-1].content), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    application = QApplication(sys.argv[:1])
    qasync.run(stream_until_killed())
