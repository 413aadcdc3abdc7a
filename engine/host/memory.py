"""Memory readings for the performance figures (engine thread).

Device memory is the GPU's when the model runs on CUDA, system memory otherwise.
"""

from __future__ import annotations

import psutil

from engine.protocol.messages import MemoryStats

KV_CACHE_BUDGET_BYTES = 2 * 1024**3
"""What the KV caches of kept conversations may hold in all, before the least recently used go."""


def device_memory(device: str) -> tuple[int, int, int]:
    """(used, free, total) bytes of the memory the model lives in."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        return total - free, free, total
    system = psutil.virtual_memory()
    return system.total - system.available, system.available, system.total


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
