"""Memory readings for the performance figures (engine thread).

Device memory is the GPU's when the model runs on CUDA, system memory otherwise. System
memory and the process's resident size come from ``psutil`` on every system; the peak
resident size from the OS's own count (``peak_rss_bytes``).
"""

from __future__ import annotations

import sys

import psutil

from engine.protocol.messages import MemoryStats

KV_CACHE_BUDGET_BYTES = 2 * 1024**3
"""What the KV caches of kept conversations may hold in all, before the least recently used go, where no block pool
sizes them from memory (the single-stream cache store)."""
CPU_SPARE_SHARE = 4
"""On the CPU the block pool may take a quarter of the memory free once the weights are in (``kv_pool_budget``)."""


def device_memory(device: str) -> tuple[int, int, int]:
    """(used, free, total) bytes of the memory the model lives in."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        return total - free, free, total
    system = psutil.virtual_memory()
    return system.total - system.available, system.available, system.total


def kv_pool_budget(device: str, planned_bytes: int | None = None) -> int:
    """Bytes the batch runner's KV pool may take (called once the weights are in).

    ``planned_bytes``: the KV cache of the context chosen at load (``LoadedModel.kv_budget_bytes``,
    ``context_choice``), which the memory estimate counted, so one conversation can always fill the whole context.
    The pool takes more where memory is spare, so several conversations share it and their prefixes stay cached: on
    the CPU ``1 / CPU_SPARE_SHARE`` of the memory free now (after the weights; the pool's pages are taken as blocks
    fill); on a GPU half of what is free (the free device memory and what the allocator holds unused; the other half
    is left for activations and CUDA graphs). Without a plan (random models, tests) that spare share alone."""
    if device == "cuda":
        import torch

        held_unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        spare = (device_memory(device)[1] + held_unused) // 2
    else:
        spare = device_memory(device)[1] // CPU_SPARE_SHARE
    return max(planned_bytes or 0, spare)


def read_memory(device: str, weight_bytes: int, kv_conversation: int, kv_total: int) -> MemoryStats:
    used, free, total = device_memory(device)
    return MemoryStats(
        device=device,
        weight_bytes=weight_bytes,
        kv_bytes_conversation=kv_conversation,
        kv_bytes_total=kv_total,
        device_used_bytes=used,
        device_free_bytes=free,
        device_total_bytes=total,
        process_rss_bytes=psutil.Process().memory_info().rss,
    )


def peak_rss_bytes() -> int:
    """The most this process has had resident (any thread): Windows' peak working set, elsewhere ``ru_maxrss``
    (KiB on Linux, where it is ``VmHWM``; bytes on macOS)."""
    if sys.platform == "win32":
        return psutil.Process().memory_info().peak_wset
    import resource  # not on Windows

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
