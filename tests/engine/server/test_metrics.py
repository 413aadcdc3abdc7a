"""``GET /metrics`` figures from the engine's samples (no server needed)."""

from __future__ import annotations

from engine.api.server.metrics import ServerMetrics
from engine.protocol.messages import BatchSampled, KVPoolStats, MemorySampled, MemoryStats


def _gauge(metrics: ServerMetrics, name: str) -> float:
    return float(metrics.render().split(f"\n{name} ")[1].split("\n")[0])


def test_the_kv_gauge_counts_cached_prefixes_after_the_requests_end() -> None:
    metrics = ServerMetrics()
    metrics.sampled(BatchSampled(1, 0, 10.0, KVPoolStats(16, 100, 4, 0, 0, 1000), 1.0))
    metrics.sampled(BatchSampled(0, 0, 0.0, KVPoolStats(16, 100, 0, 0, 4, 1000), 2.0))

    assert _gauge(metrics, "hearth_kv_cache_bytes") == 4000
    assert _gauge(metrics, "hearth_kv_cache_usage_ratio") == 0.0


def test_a_memory_sample_and_a_batch_sample_agree() -> None:
    metrics = ServerMetrics()
    metrics.sampled(BatchSampled(1, 0, 10.0, KVPoolStats(16, 100, 3, 1, 2, 1000), 1.0))
    from_batch = _gauge(metrics, "hearth_kv_cache_bytes")
    metrics.sampled(MemorySampled(MemoryStats(kv_bytes_total=5000), 2.0))

    assert from_batch == _gauge(metrics, "hearth_kv_cache_bytes") == 5000
