"""What the lazy weight mappings of model files share: the mapping's frame and exact reads (engine thread).

``GGUFState`` and ``SafetensorsState`` each hand ``FastLlama`` one tensor when it asks,
read with ``os.preadv`` into a buffer of its own (their module docstrings say why not
a memory map).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class LazyTensors(Mapping[str, Any]):
    """A mapping of tensor names to where each lies (``_tensors``); subclasses read one in ``__getitem__``."""

    _tensors: Mapping[str, Any]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def read_exactly(path: Path, buffer: memoryview, start: int) -> None:
    """Fill ``buffer`` from ``path`` at ``start`` (a single read returns at most ~2 GiB on Linux)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < len(buffer):
            got = os.preadv(descriptor, [buffer[done:]], start + done)
            if got == 0:
                raise OSError(f"{path.name} ended while reading a tensor (it changed since it was checked)")
            done += got
    finally:
        os.close(descriptor)
