"""How many CPU threads torch may use for the model (engine thread, at start-up).

One core is left to the GUI thread: a window that must never stall more than 50 ms
and a decode loop whose worker threads spin-wait on each other do not share cores
well. ``HEARTH_THREADS`` overrides the choice.
"""

from __future__ import annotations

import os

import psutil


def engine_threads() -> int:
    override = os.environ.get("HEARTH_THREADS", "")
    if override.isdigit() and int(override) > 0:
        return int(override)
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores - 1)


def apply_engine_threads() -> int:
    """Set torch's intra-op thread count for this process; returns it."""
    import torch

    threads = engine_threads()
    torch.set_num_threads(threads)
    return threads
