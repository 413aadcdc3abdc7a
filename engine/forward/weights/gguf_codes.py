"""GGUF's 5-, 6- and 8-bit blocks as integer codes with a scale per run of weights, and from there the fp32
weight or int4 groups of 32 (engine thread).

Each type holds ``w = s * x - m`` per run of 16 or 32 weights of a row (llama.cpp's ``ggml-common.h``):

* ``Q8_0`` (32 weights, 34 bytes): ``d`` fp16, 32 int8 codes ``x``; ``s = d``, no ``m``.
* ``Q5_K`` (256 weights, 176 bytes): ``d``, ``dmin`` fp16, Q4_K's 12 bytes of 6-bit scales ``sc`` and mins
  ``mn``, 32 bytes of fifth bits ``qh`` (bit i: run i), four runs of 32 bytes of nibbles (low: run 2c, high:
  run 2c + 1); per run of 32, ``s = d * sc``, ``m = dmin * mn``, ``x`` in 0…31.
* ``Q6_K`` (256 weights, 210 bytes): ``ql[128]`` low nibbles, ``qh[64]`` 2-bit highs, 16 int8 scales ``sc``,
  ``d`` fp16; per run of 16, ``s = d * sc``, ``x = q - 32``. Each half of 128 weights takes 64 bytes of ``ql``
  (weights 0…63 their low nibbles, 64…127 their high ones) and 32 of ``qh`` (weight 32j + l: bits 2j of byte l).

The arithmetic is gguf-py's (``gguf.quants.dequantize``): ``s`` and ``m`` rounded to fp32 once, then
``s * x`` and ``- m`` per weight, so the weights equal its output bit for bit, and the int4 groups equal
``quant_int.int4_groups_of`` of them: each group's lowest and highest weight are taken from the fp32 weights in
one reduction each (over a group of 32 that is a third of the time of the runs' extreme codes, whose weights
then needed eight more small passes), and a few rows are made at a time (``quant_int.rows_at_once``), so
that their few fp32 temporaries stay in the core's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.forward.weights.quant_int import (
    CPU_INT4_GROUP, Int4Groups, int4_codes, int4_group_params, rows_at_once, scales_and_zeros_of,
)

CODE_TYPES = (GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0)
FIVE_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8).view(8, 1)  # Q5_K: run i's fifth bit is bit i of qh
SIX_BIT_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)  # Q6_K: run pair j's bits 4, 5


@dataclass(frozen=True)
class Codes:
    """Rows of weights ``w = scales * values - mins`` per run: values [N, R, run] int8 or uint8,
    scales and mins [N, R] fp32 (mins None: zero)."""

    values: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    def weights(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` [N, R, ...] of these runs as fp32 weights, gguf-py's rounding: a new tensor."""
        extra = (1,) * (values.dim() - 2)
        weights = torch.mul(values, self.scales.view(*self.scales.shape, *extra))  # float(x) * s, in one pass
        return weights if self.mins is None else weights.sub_(self.mins.view(*self.mins.shape, *extra))


def dense_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    """Rows of blocks [N, bytes per row] as their fp32 weight [N, K]."""
    codes = codes_of(blocks, quant_type)
    return codes.weights(codes.values).reshape(blocks.shape[0], -1)


def int4_groups(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> Int4Groups:
    """Rows of blocks [N, bytes per row] as int4 groups of 32, equal to ``int4_groups_of(dense_rows(...))``,
    made a few rows at a time straight into the result."""
    return Int4Groups.from_row_chunks(
        blocks.shape[0], row_width(blocks, quant_type),
        lambda start, end, q: _int4_rows(blocks[start:end], quant_type, q), chunk_rows(blocks, quant_type),
    )


def row_width(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> int:
    """How many weights each row of blocks [N, bytes per row] holds."""
    block_size, type_size = GGML_QUANT_SIZES[quant_type]
    return blocks.shape[1] // type_size * block_size


def chunk_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> int:
    """How many rows of blocks [N, bytes per row] to decode at a time (``quant_int.rows_at_once``)."""
    return rows_at_once(row_width(blocks, quant_type))


def _int4_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType, q: torch.Tensor) -> torch.Tensor:
    """Rows of blocks [N, bytes per row] into their int4 codes ``q`` [N, K] uint8; returns their scales and zeros
    [G, N, 2]."""
    codes = codes_of(blocks, quant_type)
    rows = blocks.shape[0]
    grouped = codes.weights(codes.values).view(rows, -1, CPU_INT4_GROUP)  # [N, G, 32] fp32
    scales, zeros, lowest = int4_group_params(grouped.amin(dim=-1), grouped.amax(dim=-1))  # [N, G] each
    q.view(rows, -1, CPU_INT4_GROUP).copy_(int4_codes(grouped.sub_(lowest.unsqueeze(-1)), scales))
    return scales_and_zeros_of(scales, zeros)


def codes_of(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> Codes:
    """Rows of blocks [N, bytes per row] of a ``CODE_TYPES`` type as their ``Codes``."""
    type_size = GGML_QUANT_SIZES[quant_type][1]
    return DECODERS[quant_type](blocks.reshape(blocks.shape[0], -1, type_size))


def _q8_0(blocks: np.ndarray) -> Codes:
    """[N, G, 34] bytes -> int8 codes [N, G, 32], scales [N, G]."""
    values = torch.from_numpy(blocks[..., 2:]).view(torch.int8)  # [N, G, 32]
    return Codes(values, torch.from_numpy(fp16_field(blocks[..., 0:2])), None)


def _q5_k(blocks: np.ndarray) -> Codes:
    """[N, B, 176] bytes -> codes 0…31 [N, 8B, 32] uint8, scales and mins [N, 8B]."""
    rows, supers = blocks.shape[:2]
    scales, mins = k_scales_and_mins(blocks)  # [N, B, 8] each
    packed = torch.from_numpy(blocks[..., 48:]).reshape(rows, supers, 4, 1, 32)  # four runs of 32 bytes
    low = torch.cat([packed & 0x0F, packed >> 4], dim=-2).view(rows, supers, 8, 32)  # [N, B, 8, 32]
    high = torch.from_numpy(blocks[..., 16:48]).reshape(rows, supers, 1, 32) >> FIVE_BIT_SHIFTS & 0x01  # [N, B, 8, 32]
    values = (low | high << 4).view(rows, supers * 8, 32)
    return Codes(values, scales.reshape(rows, -1), mins.reshape(rows, -1))


def _q6_k(blocks: np.ndarray) -> Codes:
    """[N, B, 210] bytes -> int8 codes -32…31 [N, 16B, 16], scales [N, 16B]."""
    rows, supers = blocks.shape[:2]
    ql = torch.from_numpy(blocks[..., :128]).reshape(rows, supers, 2, 1, 64)  # two halves of 128 weights
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-2).view(rows, supers, 2, 4, 32)  # [N, B, 2, 4, 32]
    qh = torch.from_numpy(blocks[..., 128:192]).reshape(rows, supers, 2, 1, 32)
    high = qh >> SIX_BIT_SHIFTS & 0x03  # [N, B, 2, 4, 32]
    values = (low | high << 4).view(torch.int8).sub_(32).view(rows, supers * 16, 16)  # weight 128h + 32j + l
    sub_scales = blocks[..., 192:208].view(np.int8).astype(np.float32)  # [N, B, 16]
    scales = fp16_field(blocks[..., 208:210])[..., None] * sub_scales
    return Codes(values, torch.from_numpy(scales.reshape(rows, -1)), None)


def k_scales_and_mins(blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's [N, B, bytes] super-blocks: each sub-block's scale and min, fp32 [N, B, 8] each
    (``d`` and ``dmin`` fp16, then 12 bytes of 6-bit sub-scales and sub-mins), in torch's threads throughout."""
    header = torch.from_numpy(np.ascontiguousarray(blocks[..., 0:16]))  # [N, B, 16]
    d, dmin = header[..., :4].view(torch.float16).float().unsqueeze(-1).unbind(-2)  # [N, B, 1] each
    sub_scales, sub_mins = _six_bit_scales_and_mins(header[..., 4:])  # [N, B, 8] each, 0…63
    return sub_scales.mul_(d), sub_mins.mul_(dmin)


def _six_bit_scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes [N, B, 12] per super-block as its 8 sub-scales and 8 sub-mins, fp32 [N, B, 8] each: bytes 0-3
    hold scales 0-3 in their low 6 bits, 4-7 mins 0-3, and 8-11 the low 4 bits of scales (mins) 4-7 in their low
    (high) nibble, whose top 2 bits are those of bytes 0-3 (4-7); as ``gguf.quants.Q4_K.get_scale_min``, in
    torch's threads (numpy's single thread was a noticeable part of a large model's load)."""
    low_scales, low_mins, rest = packed.unflatten(-1, (3, 4)).unbind(-2)  # [N, B, 4] each
    scales = torch.cat([low_scales & 0x3F, (rest & 0x0F) | ((low_scales >> 2) & 0x30)], dim=-1)
    mins = torch.cat([low_mins & 0x3F, (rest >> 4) | ((low_mins >> 2) & 0x30)], dim=-1)
    return scales.float(), mins.float()


def fp16_field(pairs: np.ndarray) -> np.ndarray:
    """[..., 2] bytes as the fp16 number they hold, in fp32, [...]."""
    return np.ascontiguousarray(pairs).view(np.float16)[..., 0].astype(np.float32)


DECODERS = {GGMLQuantizationType.Q5_K: _q5_k, GGMLQuantizationType.Q6_K: _q6_k, GGMLQuantizationType.Q8_0: _q8_0}
