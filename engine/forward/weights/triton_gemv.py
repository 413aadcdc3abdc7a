"""One token times an int8 weight matrix, as a Triton kernel (engine thread).

At batch size 1 a linear layer is a matrix-vector product bound by the bytes of
the weight. This kernel reads each int8 weight once, converts it in registers and
applies the per-row scale at the end, so it moves one byte per weight where a
dequantize-then-matmul moves five. Triton ships with PyTorch's CUDA wheels; where
it is missing, ``available()`` is false and callers dequantize instead.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch

TUNING = ((8, 512, 4), (16, 256, 4), (4, 1024, 4), (32, 128, 8))  # (rows, columns, warps) per program


@lru_cache(maxsize=1)
def available() -> bool:
    return importlib.util.find_spec("triton") is not None


@lru_cache(maxsize=1)
def _kernels():
    """The raw kernel and its autotuned launcher (tuned per weight shape on first use, before any capture)."""
    import triton
    import triton.language as tl

    @triton.jit
    def int8_gemv(x_ptr, w_ptr, scale_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        row_ok = rows < N
        row_starts = rows.to(tl.int64) * K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)  # [BK]
            col_ok = cols < K
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + row_starts[:, None] + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0)
            acc += w.to(tl.float32) * x[None, :]
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, (tl.sum(acc, axis=1) * scale).to(out_ptr.dtype.element_ty), mask=row_ok)

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in TUNING]
    tuned = triton.autotune(configs=configs, key=["N", "K"])(int8_gemv)
    return int8_gemv, tuned


def int8_gemv(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] | None = None) -> torch.Tensor:
    """``x`` [1, K] times ``weight`` [N, K] int8 with ``scales`` [N] → [1, N] in ``x``'s dtype.

    ``block`` (rows, columns) fixes the tile instead of tuning it (Triton's interpreter has no timer).
    """
    raw, tuned = _kernels()
    n, k = weight.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    vector = x.reshape(k).contiguous()
    if block is None:
        tuned[lambda meta: (-(-n // meta["BLOCK_N"]),)](vector, weight, scales, out, n, k)
    else:
        raw[(-(-n // block[0]),)](vector, weight, scales, out, n, k, BLOCK_N=block[0], BLOCK_K=block[1])
    return out
