"""Counts tensors as transformers loads or converts them, for the load progress bar (loader thread).

transformers walks the checkpoint's tensors under a tqdm bar ("Loading weights", and
"Converting and de-quantizing GGUF tensors" for GGUF files). Its logging module lets
a hook build those bars; ours counts the items as they pass, reports them, and keeps
the bars off the terminal. Releases without the hook get no per-tensor progress.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

TensorProgress = Callable[[int, int], None]  # (tensors done, tensors in all)
_one_load_at_a_time = threading.Lock()  # the hook is process-wide


class _CountingBar:
    """Iterates like the tqdm bar it wraps, reporting each item."""

    def __init__(self, bar: Any, report: TensorProgress) -> None:
        self._bar = bar
        self._report = report

    def __iter__(self) -> Iterator[Any]:
        total = int(getattr(self._bar, "total", 0) or 0)
        for done, item in enumerate(self._bar, start=1):
            yield item
            self._report(done, total)

    def __enter__(self) -> "_CountingBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)


@contextlib.contextmanager
def report_tensors(report: TensorProgress) -> Iterator[None]:
    """While inside, transformers' tensor loops report through ``report``."""
    from transformers.utils import logging

    if not hasattr(logging, "set_tqdm_hook"):
        yield
        return

    def hook(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _CountingBar(factory(*args, **{**kwargs, "disable": True}), report)

    with _one_load_at_a_time:
        previous = logging.set_tqdm_hook(hook)
        try:
            yield
        finally:
            logging.set_tqdm_hook(previous)
