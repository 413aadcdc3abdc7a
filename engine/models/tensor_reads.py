"""What the lazy weight mappings of model files share: the mapping's frame and exact reads (engine thread).

``GGUFState`` and ``SafetensorsState`` each hand ``FastLlama`` one tensor when it asks,
read into a buffer of its own (their module docstrings say why not a memory map) through
an unbuffered file's ``readinto``: one ``read`` call a chunk straight into the buffer, on
Linux, macOS and Windows alike (Windows has no ``os.pread``/``os.preadv``; on Linux a large read
is as fast either way).
"""

from __future__ import annotations

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
    """Fill ``buffer`` from ``path`` at ``start``; OSError where the file ends first. A file of its own each call, so
    threads never share a position (a single read returns at most ~2 GiB on Linux, so it loops)."""
    with open(path, "rb", buffering=0) as file:
        file.seek(start)
        done = 0
        while done < len(buffer):
            got = file.readinto(buffer[done:])
            if not got:
                raise OSError(f"{path.name} ended while reading a tensor (it changed since it was checked)")
            done += got
