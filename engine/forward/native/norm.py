"""RMSNorm and SwiGLU of a step's rows, each in one call (engine thread).

PyTorch's ``rms_norm`` on the CPU is several ops (square, mean, add, rsqrt, multiply),
each spread over the threads, and it is called twice a layer and once more for the
output layer: at a few rows, dispatch and thread wake-up cost more than the arithmetic.
The kernel is one pass a row, on one thread below 64 rows. SwiGLU likewise: PyTorch's
SiLU and multiply are two passes, the kernel one that writes the down projection's
input whole, gpt-oss's clamped gate too.
"""

from __future__ import annotations

import math

import torch

from engine.forward.family import Clamp
from engine.forward.native.build import LANES, library


def covers(x: torch.Tensor) -> bool:
    return library() is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` [M, K] fp32 over each row's root mean square, ``x / sqrt(mean(x²) + eps)``: [M, K]."""
    x = x.contiguous()
    out = torch.empty_like(x)
    library().rms_norm(x.data_ptr(), x.shape[0], x.shape[1], eps, out.data_ptr())
    return out


def swiglu_covers(gate_up: torch.Tensor) -> bool:
    return covers(gate_up) and gate_up.shape[1] % (2 * LANES) == 0  # gate and up in whole vectors


def swiglu(gate_up: torch.Tensor, clamp: Clamp | None = None) -> torch.Tensor:
    """SiLU(gate) * up of ``gate_up`` [M, 2F] fp32 (each row's gate, then its up), or with ``clamp`` gpt-oss's
    clamped gate of them (``mlp.clamped_swiglu``): [M, F], contiguous."""
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width)
    limit, alpha, shift = (math.inf, 1.0, 0.0) if clamp is None else (clamp.limit, clamp.alpha, 1.0)
    library().swiglu(gate_up.data_ptr(), rows, width, limit, alpha, shift, out.data_ptr())
    return out
