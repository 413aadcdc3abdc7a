"""Weight packing on worker threads beside a model's load (the engine thread submits, ``WORKERS`` threads pack).

FBGEMM's fp16 prepack runs on a single core and releases the GIL; it is most of the
time a small model's fast path takes to build, the output layer a large part of it.
Handed to workers, it runs while the engine thread reads, decodes and folds the next
weights. One worker gains nothing (the engine thread's own ops already use the cores,
and slow its packing); two pack two weights at once, which shortens the load. A weight
waits for a worker in fp32, so at most ``pending`` weights are in their hands at once
(the engine thread blocks before handing over another): the load holds at most that
many fp32 copies more than it would packing each in turn.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

PENDING = 3  # weights handed over and not yet packed, those being packed included
WORKERS = 2


class Packed:
    """What a packing call returns, once the worker has run it: ``value`` (None until then)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None


class PackWorker:
    """``with PackWorker() as worker``: ``worker.pack(fn, *args)`` runs on a worker thread; leaving the block waits for
    every call and raises the first error any of them raised."""

    def __init__(self, pending: int = PENDING) -> None:
        self._slots = threading.BoundedSemaphore(pending)
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="hearth-pack")
        self._futures: list[Future[None]] = []

    def pack(self, fn: Callable[..., Any], *args: Any) -> Packed:
        """``fn(*args)`` on a worker thread, once fewer than ``pending`` calls are in the workers' hands."""
        self._slots.acquire()
        packed = Packed()

        def run() -> None:
            try:
                packed.value = fn(*args)
            finally:
                self._slots.release()

        self._futures.append(self._pool.submit(run))
        return packed

    def __enter__(self) -> PackWorker:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        self._pool.shutdown(wait=True)
        if error_type is None:  # else the engine thread's own error goes on
            for future in self._futures:
                future.result()  # the first failure, raised on the engine thread
