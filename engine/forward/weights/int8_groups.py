"""A weight in int8 groups of 32, as a GGUF file's Q8_0 blocks hold it, read without an fp32 copy (engine thread).

A Q8_0 file's layers on the CPU's int8 kernel (``native.int8_matmul``) are its own
blocks: each run of 32 weights is ``q * d``, an int8 code under the block's fp16
scale. Decoding them to fp32 and quantizing that again gave the same bytes (a block's
largest code is 127, so its scale comes back) through two passes over four bytes a
weight; ``Int8Groups`` keeps the codes and scales as they are, and the kernel lays
them out directly. Reordering, concatenating and scaling rows (a layer's q, k and v,
its attention scale) keep the groups intact, as ``Int4Groups``' do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GROUP, BLOCK_BYTES = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]  # 32 weights, 34 bytes: fp16 scale, 32 codes
SCALE_BYTES = BLOCK_BYTES - GROUP


@dataclass(frozen=True)
class Int8Groups:
    """A weight [N, K] as ``w = q * scale`` per group of 32: ``codes`` q [N, K] int8 (|q| <= 127 in a Q8_0 file),
    ``scales`` [N, K / 32] fp32, the blocks' fp16 scales widened so that a row scale folded in rounds once (to fp16,
    where the kernel lays them out)."""

    codes: torch.Tensor
    scales: torch.Tensor

    @staticmethod
    def from_q8_0(blocks: np.ndarray) -> Int8Groups:
        """Rows of Q8_0 blocks [N, bytes per row] (each row's bytes contiguous), codes and scales copied out."""
        rows = blocks.shape[0]
        per_block = blocks.reshape(rows, -1, BLOCK_BYTES)  # [N, G, 34]
        scales = np.ascontiguousarray(per_block[:, :, :SCALE_BYTES]).view(np.float16)  # [N, G, 1]
        codes = np.ascontiguousarray(per_block[:, :, SCALE_BYTES:]).view(np.int8)  # [N, G, 32]
        return Int8Groups(torch.from_numpy(codes.reshape(rows, -1)), torch.from_numpy(scales.reshape(rows, -1)).float())

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device: torch.device) -> Int8Groups:
        return Int8Groups(self.codes.to(device), self.scales.to(device))

    def __getitem__(self, rows: slice) -> Int8Groups:
        """A run of rows, as a tensor is sliced (``Int8Matmul`` lays a weight out a chunk of rows at a time)."""
        return Int8Groups(self.codes[rows], self.scales[rows])

    def rows(self, order: torch.Tensor) -> Int8Groups:
        """The rows ``order`` [N'] in that order."""
        return Int8Groups(self.codes[order], self.scales[order])

    def scaled(self, factor: float) -> Int8Groups:
        """Every weight times ``factor``: each group's scale is."""
        return Int8Groups(self.codes, self.scales * factor)

    def dequantize(self) -> torch.Tensor:
        rows, width = self.codes.shape
        grouped = self.codes.view(rows, -1, GROUP).float() * self.scales.unsqueeze(-1)  # [N, G, 32]
        return grouped.view(rows, width)  # [N, K] fp32

    @staticmethod
    def cat(parts: Sequence[Int8Groups]) -> Int8Groups:
        """The parts' rows one after another."""
        return Int8Groups(torch.cat([part.codes for part in parts]), torch.cat([part.scales for part in parts]))
