"""A weight decoded a few rows at a time where it is packed, never whole in fp32 (engine thread).

An 8B model's Q6_K output layer is 2.1 GB in fp32 against its 431 MB of blocks; the
CPU's int8 kernel (``native.int8_matmul``) quantizes it ``CHUNK_ROWS`` rows at a time
from the blocks, so the load's peak holds one chunk's fp32 rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class RowChunks:
    """A weight [rows, width] on the CPU that ``decode(start, end)`` gives in fp32 [end - start, width]; sliced by
    rows as a tensor is (``weight[start:end]``)."""

    rows: int
    width: int
    decode: Callable[[int, int], torch.Tensor]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.rows, self.width))

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, end, step = rows.indices(self.rows)
        if step != 1:
            raise ValueError("RowChunks are sliced in runs of rows")
        return self.decode(start, end)

    def dequantize(self) -> torch.Tensor:
        """The whole weight in fp32 [rows, width] (a small table, or a test's reference)."""
        return self.decode(0, self.rows)
