"""A GGUF tensor's raw blocks straight into the fast path's weight formats, one tensor at a time (engine thread).

The blocks come as numpy bytes read from the file (``engine.models.gguf_direct``)
(one row of the weight per row of bytes). The structs are llama.cpp's
(``ggml-common.h``), per block of weights of one row:

* ``Q4_0`` (32 weights, 18 bytes): ``d`` fp16, 16 bytes of nibbles; ``w = (q - 8) * d``.
* ``Q4_1`` (32 weights, 20 bytes): ``d``, ``m`` fp16, 16 bytes of nibbles; ``w = q * d + m``.
* ``Q4_K`` (256 weights, 144 bytes): ``d``, ``dmin`` fp16, 12 bytes of 6-bit scales ``sc`` and mins ``mn`` for
  its 8 sub-blocks of 32, 128 bytes of nibbles; ``w = d * sc * q - dmin * mn``.

In the first two the low nibbles of the 16 bytes are weights 0…15 and the high ones 16…31; ``Q4_K`` holds
four runs of 32 bytes, whose low nibbles are one sub-block and high nibbles the next.
All three are 16 evenly spaced values per 32 weights, which is what ``Int4Groups`` holds
(``(q - 8) * scale + zero`` per 32): they come back exactly, up to the rounding of each
group's scale and zero point where the kernel keeps them (``quant_int``). For the CPU their nibbles
go straight into its int4 kernel's byte layout (``cpu_int4_layout``), never through a byte per code.
``Q5_K``, ``Q6_K`` and ``Q8_0`` are decoded by ``gguf_codes`` (into fp32, or straight into int4 groups of 32 where every matrix is
wanted in those); every other type (F16, BF16, F32, the rarer quants) is dequantized by
``gguf.quants`` into fp32, one tensor at a time, and packed by the layer into its format from there.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from engine.forward.native import gguf_layout
from engine.forward.weights import gguf_codes
from engine.forward.weights.cpu_int4_layout import laid_out_here, packed_from_nibbles
from engine.forward.weights.gguf_codes import (
    CODE_TYPES, chunk_rows, dense_rows, fp16_field, k_scales_and_mins, row_width,
)
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS
from engine.forward.weights.quant_int import CPU_INT4_GROUP, ROWS_AT_ONCE, Int4Groups, Int4Pair, int4_groups_of

FOUR_BIT_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)


def dense(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    """Any readable type's rows of blocks [N, bytes per row] as the fp32 weight they stand for, [N, K], decoded
    ``ROWS_AT_ONCE`` rows at a time into the result: the decoder's own temporaries (several fp32 arrays the
    size of its input) stay the size of a chunk, not of a large token table. In C where it is built
    (``native.gguf_layout``: in one pass, no temporaries)."""
    if gguf_layout.takes(blocks, quant_type):
        return gguf_layout.dense_rows(blocks, quant_type)
    rows = blocks.shape[0]
    first = _dense_rows(blocks[:ROWS_AT_ONCE], quant_type)  # [min(N, ROWS_AT_ONCE), K]
    if rows <= ROWS_AT_ONCE:
        return first
    weight = torch.empty(rows, first.shape[1])  # [N, K]
    weight[:ROWS_AT_ONCE] = first
    for start in range(ROWS_AT_ONCE, rows, ROWS_AT_ONCE):
        weight[start : start + ROWS_AT_ONCE] = _dense_rows(blocks[start : start + ROWS_AT_ONCE], quant_type)
    return weight


def _dense_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    if quant_type in CODE_TYPES:
        return dense_rows(blocks, quant_type)
    # Owning its data: F32's comes back as a view of the blocks, whose buffer the next tensor's read reuses.
    return torch.from_numpy(np.require(dequantize(blocks, quant_type), np.float32, ["C", "W", "O"]))


def int4_groups(blocks: np.ndarray, quant_type: GGMLQuantizationType, cpu_layout: bool = False) -> Int4Groups:
    """A 4-bit type's blocks [N, bytes per row] as ``Int4Groups`` of 32 (see the module docstring), decoded
    a few rows at a time (``gguf_codes.chunk_rows``) straight into the result, so no full-size temporaries.
    ``cpu_layout``: the nibbles go straight into the CPU kernel's layout (``cpu_int4_layout``) where the rows come
    in whole blocks of 64, never through codes of a byte each. In one pass of C where it is built
    (``native.gguf_layout``), which also takes the 5-, 6- and 8-bit types (``requantized_groups``)."""
    rows, width = blocks.shape[0], row_width(blocks, quant_type)
    in_layout = cpu_layout and laid_out_here(rows)
    if gguf_layout.takes(blocks, quant_type):
        return _groups_in_c(blocks, quant_type, in_layout)
    if in_layout:
        return _cpu_layout_groups(blocks, quant_type, rows, width)
    return Int4Groups.from_row_chunks(
        rows, width, lambda start, end, q: _int4_rows(blocks[start:end], quant_type, q.numpy()),
        chunk_rows(blocks, quant_type),
    )


def _groups_in_c(blocks: np.ndarray, quant_type: GGMLQuantizationType, in_layout: bool) -> Int4Groups:
    """Rows of any ``gguf_layout.TYPES`` type as ``Int4Groups`` of 32 in one pass of C (``native.gguf_layout``):
    a 4-bit type's exactly, any other's requantized; ``in_layout``: in the CPU kernel's layout."""
    codes, scales_and_zeros = gguf_layout.int4_groups(blocks, quant_type, in_layout)
    return Int4Groups(codes, scales_and_zeros, CPU_INT4_GROUP, in_cpu_layout=in_layout)


def stacked_groups(parts: Sequence[tuple[GGMLQuantizationType, int, int]], blocks_of: Callable[[int], np.ndarray],
                   cpu_layout: bool) -> Int4Groups:
    """Several matrices' rows one after another as one ``Int4Groups`` of 32, each decoded in C straight into its
    rows: the same groups as ``Int4Groups.cat`` of each one's ``requantized_groups``, without that copy.
    ``parts``: each one's type (``gguf_layout.TYPES``), rows and width (all one width); ``blocks_of(i)``: part i's
    blocks [rows, bytes per row], asked for in turn (they may share a read buffer). ``cpu_layout``: in the CPU
    kernel's layout where every part comes in whole blocks of 64 rows."""
    rows = sum(part_rows for _, part_rows, _ in parts)
    width = parts[0][2]
    in_layout = cpu_layout and all(laid_out_here(part_rows) for _, part_rows, _ in parts)
    codes = torch.empty(rows, width // 2 if in_layout else width, dtype=torch.uint8)  # [N, K / 2] or [N, K]
    scales_and_zeros = torch.empty(width // CPU_INT4_GROUP, rows, 2)  # [G, N, 2]
    start = 0
    for index, (quant_type, part_rows, _) in enumerate(parts):
        end = start + part_rows
        gguf_layout.int4_groups_into(blocks_of(index), quant_type, in_layout, codes[start:end],
                                     scales_and_zeros[:, start:end])
        start = end
    return Int4Groups(codes, scales_and_zeros, CPU_INT4_GROUP, in_cpu_layout=in_layout)


def _cpu_layout_groups(blocks: np.ndarray, quant_type: GGMLQuantizationType, rows: int, width: int) -> Int4Groups:
    """``int4_groups`` in the CPU kernel's layout, a few blocks of 64 rows at a time."""
    packed = torch.empty(rows, width // 2, dtype=torch.uint8)  # [N, K / 2]
    scales_and_zeros = torch.empty(width // CPU_INT4_GROUP, rows, 2)  # [G, N, 2]
    step = max(CPU_INT4_PACK_ROWS, chunk_rows(blocks, quant_type) // CPU_INT4_PACK_ROWS * CPU_INT4_PACK_ROWS)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        scales_and_zeros[:, start:end] = _group_scales(blocks[start:end], quant_type)
        packed_from_nibbles(_nibble_runs(blocks[start:end], quant_type), packed[start:end])
    return Int4Groups(packed, scales_and_zeros, CPU_INT4_GROUP, in_cpu_layout=True)


def requantized_groups(blocks: np.ndarray, quant_type: GGMLQuantizationType, cpu_layout: bool = False) -> Int4Groups:
    """Any readable type's rows as ``Int4Groups`` of 32: 4-bit types exactly (``cpu_layout``: as ``int4_groups``),
    others quantized (``quant_int.int4_groups_of``, or its equal ``gguf_codes.int4_groups``) a chunk of rows at a
    time, never the whole tensor in fp32."""
    if quant_type in FOUR_BIT_TYPES or gguf_layout.takes(blocks, quant_type):
        return int4_groups(blocks, quant_type, cpu_layout)  # in C, where built, for 5-, 6- and 8-bit types too
    if quant_type in CODE_TYPES:
        return gguf_codes.int4_groups(blocks, quant_type)

    def quantized(start: int, end: int, q: torch.Tensor) -> torch.Tensor:
        groups = int4_groups_of(dense(blocks[start:end], quant_type))
        q.copy_(groups.q)
        return groups.scales_and_zeros

    return Int4Groups.from_row_chunks(blocks.shape[0], row_width(blocks, quant_type), quantized)


def requantized_pair(blocks: np.ndarray, quant_type: GGMLQuantizationType, cpu_layout: bool = False) -> Int4Pair:
    """Any readable type's rows as an ``Int4Pair`` (an output layer beside 4-bit layers on the CPU): a 4-bit
    type's groups exactly, in one plane (``cpu_layout``: as ``int4_groups``); any other decoded and quantized into
    two, a few rows at a time."""
    if quant_type in FOUR_BIT_TYPES:
        return Int4Pair(int4_groups(blocks, quant_type, cpu_layout), None)
    if gguf_layout.takes(blocks, quant_type):  # in C, in one pass
        coarse, fine = (Int4Groups(*plane, CPU_INT4_GROUP) for plane in gguf_layout.int4_pair(blocks, quant_type))
        return Int4Pair(coarse, fine)
    return Int4Pair.from_rows(blocks.shape[0], row_width(blocks, quant_type),
                              lambda start, end: _dense_rows(blocks[start:end], quant_type))


def _int4_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType, q: np.ndarray) -> torch.Tensor:
    """Rows of blocks [N, bytes per row] into their codes ``q`` [N, K] uint8; returns scales and zeros [G, N, 2]."""
    runs = _nibble_runs(blocks, quant_type).unsqueeze(-2)  # [N, R, 1, L]
    _split_nibbles(runs, q.reshape(*runs.shape[:2], 2, runs.shape[-1]))  # [N, R, 2, L]: low nibbles first
    return _group_scales(blocks, quant_type)


def _nibble_runs(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    """Rows of blocks [N, bytes per row] as their runs of nibble bytes [N, R, L] (a view): byte i of run r holds
    weight 2Lr + i low and 2Lr + L + i high (Q4_0, Q4_1: a run of 16 per block; Q4_K: four of 32 per block)."""
    rows = blocks.shape[0]
    if quant_type == GGMLQuantizationType.Q4_K:
        return torch.from_numpy(blocks.reshape(rows, -1, 144)[..., 16:]).reshape(rows, -1, 32)
    start = 4 if quant_type == GGMLQuantizationType.Q4_1 else 2
    return torch.from_numpy(blocks.reshape(rows, -1, start + 16)[..., start:])  # [N, G, 16]


def _group_scales(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    """Rows of blocks [N, bytes per row]: each group of 32's scale and zero, [G, N, 2] fp32 (``(q - 8) s + z``)."""
    rows = blocks.shape[0]
    if quant_type == GGMLQuantizationType.Q4_K:
        scales, mins = k_scales_and_mins(blocks.reshape(rows, -1, 144))  # [N, B, 8] each: one per sub-block
        pairs = torch.stack([scales, scales * 8 - mins], dim=-1)  # (q - 8) s + z = s q - min
        return pairs.view(rows, -1, 2).transpose(0, 1)  # [G, N, 2]
    with_min = quant_type == GGMLQuantizationType.Q4_1
    runs = blocks.reshape(rows, -1, 20 if with_min else 18)  # [N, G, bytes]
    scales = fp16_field(runs[..., 0:2])  # [N, G]
    zeros = fp16_field(runs[..., 2:4]) + 8 * scales if with_min else np.zeros_like(scales)  # (q - 8) d + z = q d + m
    return torch.from_numpy(np.stack([scales, zeros], axis=-1)).transpose(0, 1)  # [G, N, 2]


def _split_nibbles(packed: torch.Tensor, nibbles: np.ndarray) -> None:
    """Bytes [..., 1, L] into ``nibbles`` [..., 2, L] uint8: their low nibbles, then their high ones. In torch's
    threads, which makes it faster than numpy's two single-threaded ufuncs."""
    torch.cat([packed & 0x0F, packed >> 4], dim=-2, out=torch.from_numpy(nibbles))


class BlockTable:
    """A token table kept as the file's blocks, [V, bytes per row] uint8: a lookup decodes just its rows
    (``dense``), exactly as the whole table would decode, like llama.cpp's row lookup. A quantized table holds a
    fraction of fp16's bytes (Q8_0 about half, Q4_K a quarter)."""

    def __init__(self, blocks: np.ndarray, quant_type: GGMLQuantizationType, dtype: torch.dtype) -> None:
        self._blocks, self._quant_type, self._dtype = blocks, quant_type, dtype
        self.nbytes = blocks.nbytes

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        rows = self._blocks[token_ids.cpu().numpy()]  # [S, bytes per row]
        return dense(rows, self._quant_type).to(self._dtype)  # [S, D]
