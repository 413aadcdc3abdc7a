"""A few rows times 4-bit weights in the CPU int4 layout, with VNNI's int8 dot products (engine thread).

PyTorch's ``_weight_int4pack_mm_for_cpu`` rounds the activations to bf16 and turns
every code into a float for a fused multiply-add, once per activation row. Here each
group of 32 activations becomes int8 codes under its largest magnitude / 127: two codes
a value (``scale * (high + low / 254)``, about 15 bits: a product's relative error ~3e-5
against bf16's ~3e-3) for a sequence's own rows, one (llama.cpp's Q8_0) in a batched
step (``activation_codes``). Four codes of 16 weight rows meet four activations in one
``vpdpbusd``; a block's bytes are read once for every two activation rows. The weights
are the layout ``cpu_int4_layout`` writes, untouched. It is faster than PyTorch's kernel
for the row counts it takes.

In the avx512 variant calls of 16 rows or more take strips: 32 weight rows meet several
activation rows at a time, so a byte gather serves that many rows' dot products. That
makes it the prompts' path too (``takes_prompts``), as the AVX2 variants' kernel is
(``PROMPT_VARIANTS``): from ``activation_codes.MANY_ROWS`` rows (prompt chunks) the activations take one
code a value, as llama.cpp's Q8_0, at twice the rate of two codes; a product's relative
error is then about 0.5 %, within the 0.7 % of the int8 GEMM (``int4_prompts``) that this
path replaces.

Where the CPU has AMX's bf16 tiles (``runs_on_amx``), calls of ``AMX_ROWS`` rows or more
(prompt chunks, batched steps) take ``int4_matmul_amx`` instead: a strip of 32 weight rows
is dequantized to bf16 (each weight rounded once from fp32) into tiles in the thread's
cache and multiplied there with the activations rounded to bf16, summed in fp32. No
weight goes to memory and nothing is reordered, which is what oneDNN's bf16 GEMM on a
dequantized copy spent most of a small call on.
"""

from __future__ import annotations

import torch

from engine.forward.native import activation_codes, int4_scales
from engine.forward.native.build import activation_scratch, address, kernels_variant, library
from engine.forward.native.scratch import Scratch
from engine.forward.native.variants import PROMPT_VARIANTS
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS
from engine.host.cpu_features import has_amx_tiles

CODES_PER_DOT = 4  # activations a 32-bit lane of ``vpdpbusd`` takes
AMX_DEPTH = 32  # columns one tile product sums: K and a group whole multiples of it
AMX_ROW_PASS = 32  # activation rows a pass of tile products takes: the rows are padded to a multiple of it
AMX_ROWS = 8
"""Rows from which a call takes the tiles rather than the int4 kernel: from about here a step's matmuls cost less
on the tiles for small and mid-sized models alike. Dequantizing the strips is most of a small call, so the tiles cost
about the same from 1 row to 32, while the int4 kernel's cost grows with the rows."""
_AMX_ACTIVATIONS, _AMX_TILES = Scratch(torch.bfloat16), Scratch(torch.bfloat16)


def covers(rows: int, width: int, group: int) -> bool:
    """Whether a weight [rows, width] in groups of ``group`` runs here: whole blocks, whole groups of whole dots."""
    return (library() is not None and rows % CPU_INT4_PACK_ROWS == 0 and group % CODES_PER_DOT == 0
            and width % group == 0)


def takes_prompts() -> bool:
    """Whether calls of many rows (prompt chunks) run here rather than on ``int4_prompts``' GEMMs: on AMX's tiles, or
    on the kernel of a variant in ``PROMPT_VARIANTS``."""
    return runs_on_amx() or (library() is not None and kernels_variant("cpu") in PROMPT_VARIANTS)


def runs_on_amx() -> bool:
    """Whether calls of many rows multiply on AMX's bf16 tiles here: the CPU has them, Linux grants their state
    and the variant of Hearth's kernels that runs here is built with them."""
    return has_amx_tiles() and library() is not None and library().amx_enable() == 0


class Int4Matmul:
    """``x`` [M, K] fp32 times the weight [N, K] that ``packed`` [N, K / 2] uint8 (the CPU int4 layout) and
    ``scales_and_zeros`` [K / group, N, 2] hold (fp32 or bf16), ``w = (q - 8) * scale + zero``: [M, N] fp32.
    ``packed`` is kept as it is; the scales and zeros become the kernels' own (``int4_scales``), a block of 64 rows'
    together, so a decode step reads them in order beside the codes. Their addresses are taken once: a call costs one
    ctypes call beside the kernel."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> None:
        self._kernel = library().int4_matmul
        self._groups, rows, _ = scales_and_zeros.shape
        self._packed = packed
        self._group_scales = int4_scales.block_scales(scales_and_zeros)  # [N / 64, bytes]
        self._addresses = (address(packed), address(self._group_scales))
        self._rows, self._group = rows, group
        self.nbytes = packed.numel() + self._group_scales.numel()
        self.on_amx = runs_on_amx() and group % AMX_DEPTH == 0
        self.takes_prompts = self.on_amx or takes_prompts()  # then calls of any number of rows run here

    def scales_and_zeros(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start`` … ``end`` (whole blocks) in PyTorch's order, [K / group, n, 2] fp32: the values the kernel
        multiplies by."""
        blocks = self._group_scales[start // CPU_INT4_PACK_ROWS : end // CPU_INT4_PACK_ROWS]
        return int4_scales.scales_and_zeros_of(blocks, self._groups)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_amx and x.shape[0] >= AMX_ROWS:
            return self._on_tiles(x)
        x = x.contiguous()
        length, width = x.shape
        scratch = activation_scratch(length, width, self._group)
        out = torch.empty(length, self._rows)
        self._kernel(x.data_ptr(), length, width, *self._addresses, self._rows, self._group,
                     activation_codes.codes_for_rows(length), scratch, out.data_ptr())
        return out

    def _on_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [M, K] on AMX's tiles (the module docstring): the kernel rounds its rows to bf16, padded with zero
        rows, into a reused buffer, rather than rounding and padding them in PyTorch and slicing the buffers, which
        costs more than the kernel's own rounding (a step makes such a call per matmul)."""
        x = x.contiguous()
        length, width = x.shape
        activations, threads, tiles = tile_scratch(length, width)
        out = torch.empty(length, self._rows)
        library().int4_matmul_amx(x.data_ptr(), length, width, activations, *self._addresses, self._rows,
                                  self._group, threads, tiles, out.data_ptr())
        return out


def tile_scratch(length: int, width: int) -> tuple[int, int, int]:
    """The buffers of a call on AMX's tiles of ``length`` activation rows of ``width`` (every format's): the
    activations' address (their bf16 rows padded to a pass of tile products), the threads and their tiles' address
    (a strip's tiles a thread, K * 64 bytes). Reused by every call: the engine thread makes one at a time."""
    padded = -(-length // AMX_ROW_PASS) * AMX_ROW_PASS
    threads = torch.get_num_threads()
    activations = _AMX_ACTIVATIONS.address(padded * width)  # [M', K] bf16
    return activations, threads, _AMX_TILES.address(threads * width * AMX_DEPTH)
