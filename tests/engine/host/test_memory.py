"""The process's memory readings come from the OS on any system (``host.memory``)."""

from __future__ import annotations

import psutil

from engine.host.memory import peak_rss_bytes, read_memory


def test_the_peak_resident_size_counts_memory_since_freed():
    """In bytes on every system (Linux counts ``ru_maxrss`` in KiB, macOS in bytes)."""
    written = b"\1" * (256 * 1024 * 1024)  # every page written, so resident
    held = psutil.Process().memory_info().rss
    del written
    assert held > 256 * 1024 * 1024 and peak_rss_bytes() > 0.9 * held  # the OS updates its count lazily


def test_system_memory_and_the_resident_size_are_psutils():
    stats = read_memory("cpu", 0, 0, 0)
    assert 0 < stats.device_free_bytes < stats.device_total_bytes == psutil.virtual_memory().total
    assert 0 < stats.process_rss_bytes <= peak_rss_bytes()
