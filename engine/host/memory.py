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


def kv_pool_budget(device: str) -> int:
    """Bytes the batch runner's KV pool may take. On a GPU half of what is free once the weights are in (the free
    device memory and what the allocator holds unused; the other half is left for activations and CUDA graphs);
    elsewhere ``KV_CACHE_BUDGET_BYTES``, since system memory is shared with everything else."""
    if device != "cuda":
        return KV_CACHE_BUDGET_BYTES
    import torch

    held_unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return (device_memory(device)[1] + held_unused) // 2


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
