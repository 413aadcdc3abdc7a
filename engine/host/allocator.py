"""Freed working buffers stay in the process for the next forward pass (engine thread, at start-up).

glibc hands out blocks above its mmap threshold (128 KiB at first) as fresh pages
from the kernel and gives them back when freed, raising the threshold only as such
blocks come back. A prompt's forward pass allocates activations of a few hundred
KiB to a few MiB per matmul, so the first prompts after start-up, and the first
of each longer size, paid a page fault per 4 KiB of each, and ran far slower than
the same prompt later.
``keep_freed_buffers`` fixes the threshold at 32 MiB (the most glibc's own rule
would reach) and the trim threshold at 64 MiB, so freed activations are reused at
once; larger blocks (a big model's weight matrices) still come from the kernel and
go back to it. ``return_freed_memory`` hands the freed heap back to the kernel: a
load calls it between two tensors, whose temporaries would otherwise stay in the
process beside the packed weights. On other C libraries both do nothing.

``back_with_huge_pages`` has PyTorch's CPU allocator align each buffer of 2 MiB or more
to 2 MiB and ask Linux for transparent huge pages there (``madvise``, which the usual
``madvise`` setting of ``/sys/kernel/mm/transparent_hugepage/enabled`` honours). A
decode step streams every weight once, and in 4 KiB pages that is a page-table walk per
4 KiB it reads (figures in ``docs/performance.md``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024**2
TRIM_THRESHOLD_BYTES = 64 * 1024**2
HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"  # PyTorch's: 1 backs buffers of 2 MiB or more with huge pages


def set_up_process_memory() -> None:
    """How the engine's process holds memory, set once before its first model: freed buffers kept
    (``keep_freed_buffers``), large ones in huge pages (``back_with_huge_pages``)."""
    keep_freed_buffers()
    back_with_huge_pages()


def back_with_huge_pages() -> None:
    """Have PyTorch's CPU allocator back buffers of 2 MiB or more with transparent huge pages from now on, unless
    ``THP_MEM_ALLOC_ENABLE`` already says otherwise (the environment wins)."""
    os.environ.setdefault(HUGE_PAGES_VARIABLE, "1")


def keep_freed_buffers() -> bool:
    """Set glibc's mmap and trim thresholds for the whole process; whether they were set."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1


def return_freed_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``), so they leave the resident set."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
        trim(0)


def _glibc(name: str) -> Any:
    """A function of glibc, or None on other platforms and C libraries (musl has no mallopt)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(_libc(), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
