"""Reused buffers for the CPU kernels and the prompt GEMMs (engine thread: only it runs them, one call at a time,
so every layer shares one buffer of each kind)."""

from __future__ import annotations

import torch


class Scratch:
    """A reused buffer of one dtype, grown to the largest block asked for; made again outside inference mode where
    it was made inside (such a tensor cannot be written there)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._buffer = torch.empty(0, dtype=dtype)

    def take(self, size: int) -> torch.Tensor:
        if self._buffer.numel() < size or (self._buffer.is_inference() and not torch.is_inference_mode_enabled()):
            self._buffer = torch.empty(size, dtype=self._buffer.dtype)
        return self._buffer[:size]

    def address(self, size: int) -> int:
        """Where a block of ``size`` values starts, for a kernel to write (no tensor made: a slice costs more)."""
        if self._buffer.numel() < size:
            self._buffer = torch.empty(size, dtype=self._buffer.dtype)
        return self._buffer.data_ptr()
