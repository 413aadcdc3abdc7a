"""Bytes the packed weight formats occupy, as arithmetic on shapes (any thread; imports no torch).

``quant`` reports these for the weights it packs and ``memory_estimate`` counts them before a load.
"""

from __future__ import annotations

FBGEMM_FP16_BLOCK = 512  # PackedGemmMatrixFP16's block of the reduced dimension, as PyTorch builds it


def fp16_packed_bytes(rows: int, width: int) -> int:
    """What FBGEMM's prepacked fp16 weight [rows, width] occupies: it packs the width in blocks of
    ``FBGEMM_FP16_BLOCK``, the last padded with zeros (SmolLM2's width 576 takes 1024 columns' bytes)."""
    return rows * -(-width // FBGEMM_FP16_BLOCK) * FBGEMM_FP16_BLOCK * 2
