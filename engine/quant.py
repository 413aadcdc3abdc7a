"""Linear layers and embedding tables in the weight formats of the fast path (engine thread).

At batch size 1 a decode step reads every weight once, so the bytes per weight
set the speed. On the CPU, ``fp16`` uses FBGEMM's prepacked half-precision
kernel, which PyTorch ships: weights in half precision, products and sums in
fp32, so results stay within rounding of fp32 at half the bytes. (FBGEMM's int8
kernel quantizes activations too and costs ~0.5 ms per call whatever the size,
which is slower than fp32 for a small model, so it is not used.) Elsewhere
``fp32``/``bf16``/``fp16`` are plain matmuls in that dtype, and ``int8``/``int4``
are weight-only quantized (``quant_cuda``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from engine.quant_cuda import QUANT_FORMATS, pack_quantized

CPU_FORMATS = ("fp32", "fp16")
PLAIN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Linear:
    """``y = x @ W.T + b`` with ``W`` [N, K] held in ``fmt``; ``nbytes`` is what the weight occupies."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> None:
        self.fmt = fmt
        self.compute_dtype = _compute_dtype(weight.device, fmt)
        self._run, self.nbytes = _pack(weight, bias, fmt, self.compute_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)  # [..., K] -> [..., N]


def _compute_dtype(device: torch.device, fmt: str) -> torch.dtype:
    if device.type == "cpu":
        return torch.float32  # FBGEMM takes fp32 activations whatever the weight format
    return PLAIN_DTYPES.get(fmt, torch.bfloat16)  # quantized formats compute in bf16 (see quant_cuda)


def _pack(
    weight: torch.Tensor, bias: torch.Tensor | None, fmt: str, dtype: torch.dtype
) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    if weight.device.type == "cpu" and fmt == "fp16":
        packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), _fp32(bias))
        return (lambda x: torch.ops.quantized.linear_dynamic_fp16(x, packed)), weight.numel() * 2
    if fmt in QUANT_FORMATS:
        return pack_quantized(weight, bias, fmt)
    if fmt not in PLAIN_DTYPES:
        raise ValueError(f"Weight format {fmt!r} is not supported on {weight.device.type}.")
    weight = weight.to(dtype).contiguous()
    bias = bias.to(dtype) if bias is not None else None
    return (lambda x: F.linear(x, weight, bias)), weight.numel() * weight.element_size()


def _fp32(bias: torch.Tensor | None) -> torch.Tensor | None:
    return bias.float().contiguous() if bias is not None else None


class Embedding:
    """Token id → hidden vector, from a table kept in the weight format (rows are converted on lookup)."""

    def __init__(self, table: torch.Tensor, fmt: str, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._table = table.to(torch.float16 if fmt == "fp16" else dtype)  # [V, D]
        self.nbytes = self._table.numel() * self._table.element_size()

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self._table).to(self.dtype)  # [S, D]
