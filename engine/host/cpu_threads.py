"""How many CPU threads torch may use for the model (engine thread, at start-up).

One per physical core: decoding is bound by memory bandwidth, which more cores
raise. The GUI thread's share while a reply streams is small (the performance
panel's refresh costs a small part of a core), and ``python -m app.perf.bench.panel`` checks
that it does not slow decoding. ``HEARTH_THREADS`` (``config.EngineConfig.threads``)
overrides the choice.
"""

from __future__ import annotations

import os

import psutil

from engine.host.config import EngineConfig


def engine_threads(config: EngineConfig | None = None) -> int:
    """``config``'s threads (read from the environment when not given), else one per physical core."""
    config = config or EngineConfig.from_environment()
    return config.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1


def apply_engine_threads(config: EngineConfig | None = None) -> int:
    """Set torch's intra-op thread count for this process; returns it."""
    import torch

    threads = engine_threads(config)
    torch.set_num_threads(threads)
    return threads
