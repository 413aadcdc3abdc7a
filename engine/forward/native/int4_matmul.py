"""A few rows times 4-bit weights in the CPU int4 layout, with VNNI's int8 dot products (engine thread).

PyTorch's ``_weight_int4pack_mm_for_cpu`` rounds the activations to bf16 and turns
every code into a float for a fused multiply-add, once per activation row. Here each
group of 32 activations becomes two int8 codes a value (``scale * (high + low / 254)``,
about 15 bits: a product's relative error ~3e-5 against bf16's ~3e-3) and four codes of
16 weight rows meet four activations in one ``vpdpbusd``; a block's bytes are read once
for every two activation rows. The weights are the layout ``cpu_int4_layout`` writes,
untouched. Measured on a 2-core Zen 4: 1.3-1.5x PyTorch's kernel from 16 to 127 rows on an
8B model's matrices; SmolLM2-1.7B's Q4_K_M decode 12.8 -> 19.0 tok/s (llama.cpp 22.2 and 24.2 in
the same runs).
"""

from __future__ import annotations

import torch

from engine.forward.native.build import address, library
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS

CODES_PER_DOT = 4  # activations a 32-bit lane of ``vpdpbusd`` takes


def covers(rows: int, width: int, group: int) -> bool:
    """Whether a weight [rows, width] in groups of ``group`` runs here: whole blocks, whole groups of whole dots."""
    return (library() is not None and rows % CPU_INT4_PACK_ROWS == 0 and group % CODES_PER_DOT == 0
            and width % group == 0)


class Int4Matmul:
    """``x`` [M, K] fp32 times the weight [N, K] that ``packed`` [N, K / 2] uint8 (the CPU int4 layout) and
    ``scales_and_zeros`` [K / group, N, 2] bf16 hold, ``w = (q - 8) * scale + zero``: [M, N] fp32. Both are kept,
    and their addresses taken once: a call costs one ctypes call beside the kernel (~5 µs)."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> None:
        self._kernel = library().int4_matmul
        self._packed, self._scales_and_zeros = packed, scales_and_zeros
        self._addresses = (address(packed), address(scales_and_zeros))
        self._rows, self._group = packed.shape[0], group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        length, width = x.shape
        scratch = torch.empty(length * (2 * width + 8 * (width // self._group)), dtype=torch.uint8)  # codes, figures
        out = torch.empty(length, self._rows)
        self._kernel(x.data_ptr(), length, width, *self._addresses, self._rows, self._group, scratch.data_ptr(),
                     out.data_ptr())
        return out
