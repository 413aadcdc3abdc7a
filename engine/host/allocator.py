"""Freed working buffers stay in the process for the next forward pass (engine thread, at start-up).

glibc hands out blocks above its mmap threshold (128 KiB at first) as fresh pages
from the kernel and gives them back when freed, raising the threshold only as such
blocks come back. A prompt's forward pass allocates activations of a few hundred
KiB to a few MiB per matmul, so the first prompts after start-up, and the first
of each longer size, paid a page fault per 4 KiB of each: a 72-token prompt into
the built-in model took ~377 ms for its first few runs and ~120 ms after.
``keep_freed_buffers`` fixes the threshold at 32 MiB (the most glibc's own rule
would reach) and the trim threshold at 64 MiB, so freed activations are reused at
once; larger blocks (a big model's weight matrices) still come from the kernel and
go back to it. On other C libraries it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024**2
TRIM_THRESHOLD_BYTES = 64 * 1024**2


def keep_freed_buffers() -> bool:
    """Set glibc's mmap and trim thresholds for the whole process; whether they were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
