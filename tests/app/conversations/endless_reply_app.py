"""A Hearth window whose fake model never stops writing: the target of the kill -9 test (GUI thread).

Run as a script with HEARTH_HOME set. It sends one message, waits until the reply has streamed
for ``STREAM_S`` seconds (so at least one checkpoint happened), prints the length shown so far
on stdout, and keeps streaming until it is killed. With the argument ``two`` it then opens a
new conversation and sends ``SECOND_QUESTION`` there too, while the first reply goes on: the
fake engine writes both replies in turn, as a batching engine does; after another
``STREAM_S`` it prints the length of each reply, the first one's first.
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
from engine.service.worker import ServesWhole

STREAM_S = 1.6
QUESTION = "Tell me everything"
SECOND_QUESTION = "Tell me more"


class EndlessRuntime(ServesWhole):
    """Loads instantly and answers every Generate with words, forever; later Generates join in turn."""

    def __init__(self, emit: EventSink, watch: CancelWatch) -> None:
        self._emit = emit
        self._watch = watch

    def handle(self, request: Request) -> None:
        if isinstance(request, LoadModel):
            self._emit(ModelLoaded(request.request_id, "Endless", request.path, "cpu", "fp32", 2048, 0.0))
        elif isinstance(request, Generate):
            counts = {request.request_id: 0}
            while True:
                time.sleep(0.005)
                for request_id, count in counts.items():
                    self._emit(TokenStreamed(request_id, f"word{count} ", count + 1, 200.0, time.time()))
                    counts[request_id] = count + 1
                arrived = self._watch.next_request(timeout=0)
                if isinstance(arrived, Generate):
                    counts[arrived.request_id] = 0

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
    first = window.session.conversation
    print(len(first.messages[-1].content), flush=True)
    if "two" in sys.argv[1:]:
        window.conversations.new_conversation()
        window.session.send(SECOND_QUESTION)
        await asyncio.sleep(STREAM_S)
        second = window.session.conversation
        print(len(first.messages[-1].content), len(second.messages[-1].content), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    application = QApplication(sys.argv[:1])
    qasync.run(stream_until_killed())
