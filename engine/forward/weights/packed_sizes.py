"""Bytes the packed weight formats occupy, as arithmetic on shapes (any thread; imports no torch).

``quant`` reports these for the weights it packs and ``memory_estimate`` counts them before a load.
"""

from __future__ import annotations

FBGEMM_FP16_BLOCK = 512  # PackedGemmMatrixFP16's block of the reduced dimension, as PyTorch builds it
CPU_INT4_PACK_ROWS = 64  # the CPU int4 kernel's row blocks (``cpu_int4_layout`` lays them out)
INT8_BLOCK_ROWS, INT8_GROUP = 64, 32  # the CPU int8 kernel's row blocks and the columns a scale covers
FP32_BYTES, FP16_BYTES = 4, 2
INT4_PAIR = "int4x2"
"""Two planes of 4-bit groups, the second holding what the first's rounding left (``Int4Pair``): about 8 bits'
precision on the int4 kernel, at twice its bytes. The CPU's output layer beside 4-bit layers: a 4-bit output
layer changes many of a small model's teacher-forced top-1 next tokens, where this one keeps them about as close
to fp32's as an exact output layer does."""
OUTPUT_ROWS = "output"  # a token table looked up in the int8 output layer it is tied to (``quant.OutputRows``)
ONEDNN_FP16_WEIGHTS = 1 << 22
"""From this many weights an fp16 copy that only prompts use runs on oneDNN's fp16 matmul where the CPU has fp16
arithmetic (``cpu_features``): products in fp16, sums in fp32 (a little less exact than FBGEMM). There large
matrices run faster than on FBGEMM at every prompt chunk's size; smaller ones run slower at short chunks, so
they stay on FBGEMM."""
TAIL_APART_ROWS = 2048
"""Rows from which a tail is worth its extra call: splitting every 576-wide matrix of SmolLM2-135M makes its chat
turns slower, splitting only gate/up's 3 072 rows (most of the padded bytes) costs them next to nothing."""


def fp16_tail_width(rows: int, width: int) -> int:
    """Columns of an fp16 weight [rows, width] kept beside FBGEMM's packed matrix in fp32: FBGEMM packs the
    width in blocks of ``FBGEMM_FP16_BLOCK``, the last padded with zeros, so a short last block (SmolLM2's 576 =
    512 + 64) costs less in fp32 than padded; 0 where the padding is the smaller (or there is none), for
    widths under one block, and for fewer than ``TAIL_APART_ROWS`` rows."""
    tail = width % FBGEMM_FP16_BLOCK
    shorter = tail * FP32_BYTES < (FBGEMM_FP16_BLOCK - tail) * FP16_BYTES
    return tail if shorter and width > FBGEMM_FP16_BLOCK and rows >= TAIL_APART_ROWS else 0


def runs_on_onednn(rows: int, width: int, prompts_only: bool, fp16_math: bool) -> bool:
    """Whether an fp16 weight [rows, width] runs on oneDNN's fp16 matmul (``ONEDNN_FP16_WEIGHTS``)."""
    return prompts_only and fp16_math and rows * width >= ONEDNN_FP16_WEIGHTS


def fp16_packed_bytes(rows: int, width: int, prompts_only: bool, fp16_math: bool) -> int:
    """What an fp16 weight [rows, width] occupies on the CPU: oneDNN's 2 bytes a weight (``runs_on_onednn``), or
    FBGEMM's packed blocks (the last padded with zeros), for a copy only prompts use (``quant``) the fp32 tail of
    ``fp16_tail_width`` columns where it has one and the blocks before it."""
    if runs_on_onednn(rows, width, prompts_only, fp16_math):
        return rows * width * FP16_BYTES
    tail = fp16_tail_width(rows, width) if prompts_only else 0
    packed = -(-(width - tail) // FBGEMM_FP16_BLOCK) * FBGEMM_FP16_BLOCK
    return rows * (packed * FP16_BYTES + tail * FP32_BYTES)


def int8_kernel_takes(rows: int, width: int) -> bool:
    """Whether the CPU int8 kernel (``native.int8_matmul``) takes a weight [rows, width]: whole blocks and groups."""
    return rows % INT8_BLOCK_ROWS == 0 and width % INT8_GROUP == 0


def int8_bytes(rows: int, width: int) -> int:
    """An int8 weight [rows, width] in the CPU kernel's layout: a byte a weight, an fp16 scale a group."""
    return rows * width + rows * (width // INT8_GROUP) * FP16_BYTES
