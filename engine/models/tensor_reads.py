"""What the lazy weight mappings of model files share: the mapping's frame and exact reads (engine thread).

``GGUFState`` and ``SafetensorsState`` each hand ``FastLlama`` one tensor when it asks. Bytes a caller keeps
are read into a buffer of their own (``read_exactly``) through an unbuffered file's ``readinto``: one ``read``
call a chunk straight into the buffer, on Linux, macOS and Windows alike (Windows has no
``os.pread``/``os.preadv``), a large read in spans on threads. Bytes that are only decoded into a form of their
own are mapped instead (``mapped_bytes``: ``GGUFState``'s layer tensors), for as long as the decoding takes.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

READ_THREADS = 2  # spans a large read is split into, read at once
PARALLEL_READ_BYTES = 16 << 20  # the size from which a read is split


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
    """Fill ``buffer`` from ``path`` at ``start``; OSError where the file ends first. A read of
    ``PARALLEL_READ_BYTES`` or more is split into ``READ_THREADS`` spans read at once, each through a file of its
    own (copying from the page cache is per-core work: one core alone reaches a fraction of memory speed)."""
    size = len(buffer)
    if size < PARALLEL_READ_BYTES:
        _read_span(path, buffer, start)
        return
    bounds = [size * part // READ_THREADS for part in range(READ_THREADS + 1)]
    with ThreadPoolExecutor(READ_THREADS) as pool:
        spans = [pool.submit(_read_span, path, buffer[low:high], start + low) for low, high in zip(bounds, bounds[1:])]
        for span in spans:
            span.result()


def _read_span(path: Path, buffer: memoryview, start: int) -> None:
    """``read_exactly`` in one thread: a file of its own, so threads never share a position (a single read returns
    at most ~2 GiB on Linux, so it loops)."""
    with open(path, "rb", buffering=0) as file:
        file.seek(start)
        done = 0
        while done < len(buffer):
            got = file.readinto(buffer[done:])
            if not got:
                raise OSError(f"{path.name} ended while reading a tensor (it changed since it was checked)")
            done += got


def mapped_bytes(path: Path, start: int, size: int) -> np.ndarray:
    """``size`` bytes of ``path`` from ``start``, mapped from the page cache rather than copied: [size] uint8,
    read-only. The mapping lasts as long as the array (and any view of it) does, so a caller that drops it keeps
    nothing resident; where a 4-bit file is converted at load this saves reading every byte twice. On Linux the
    pages are mapped at once (``MAP_POPULATE``). OSError where the file no longer holds those bytes: mapped bytes
    past its end would fault when touched."""
    skip = start % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb", buffering=0) as file:
        if os.fstat(file.fileno()).st_size < start + size:
            raise OSError(f"{path.name} ended while reading a tensor (it changed since it was checked)")
        if size == 0:
            return np.empty(0, dtype=np.uint8)
        if hasattr(mmap, "MAP_POPULATE"):
            mapping = mmap.mmap(file.fileno(), skip + size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                prot=mmap.PROT_READ, offset=start - skip)
        else:
            mapping = mmap.mmap(file.fileno(), skip + size, access=mmap.ACCESS_READ, offset=start - skip)
    return np.frombuffer(mapping, dtype=np.uint8, count=size, offset=skip)
