"""Prompt chunks over the CPU's packed 4-bit weights, as one bf16, int8 or fp32 GEMM (engine thread).

A model that only fits in 4 bits (an 8B GGUF on a 16 GB machine) runs its prompts on
the same weights as its decode steps. PyTorch's int4 kernel is made for a few rows:
at a 512-token chunk it multiplies at about half of MKL's fp32 rate. So a call of
``prompt_rows()`` rows or more multiplies in the fastest GEMM the CPU has:

* bf16, where the CPU has AMX's bf16 tiles (``cpu_features.has_bf16_matmul``) and
  Hearth's kernels are built: a block of rows at a time is dequantized by one C pass
  (``int4_dequantize_bf16``) into a reused bf16 buffer, transposed, and oneDNN
  multiplies it with the activations rounded to bf16. Measured on a 2-core Sapphire
  Rapids at 512 rows: 18 ms for SmolLM2-1.7B's 8192x2048 matrix against the int8
  path's 62-67 and fp32's 96-105, a product's relative error 0.3 % (int8's 0.65 %);
  its 512-token prompts 157 tok/s against 72 (llama.cpp 63-66 in the same runs),
  SmolLM2-135M's 4096-token ones 576 against 404 from an fp16 copy (llama.cpp 164).
* int8, where the CPU has VNNI (``cpu_features.has_int8_dot``):

  - weights: a block of rows at a time is unpacked into int8 in one reused buffer,
    ``(q - 8) * scale`` of each group of 32 over one scale per row (the largest group's),
    rounded; the zero points are exact, one small fp32 matmul of the groups' sums of
    the activations.
  - activations: each row as ``scale * (high + low / LOW_STEPS)``, two int8 codes a value
    (about 15 bits), both multiplied in the same GEMM. A single int8 code per value
    (llama.cpp rounds its activations so, per block of 32) cost the built-in model a
    tenth of its teacher-forced top-1 tokens.

  Measured on an 8B model's matrices at 512 rows (2 threads, AVX512-VNNI): 1.4-1.6x the
  fp32 path (1.3x with oneDNN held to AVX-VNNI); an 8B Q4_K_M prompt of 512 tokens 1.22x
  llama.cpp's rate. A product's relative error is about 0.6 % (the weights' rounding to
  int8 rows).
* fp32 otherwise: the weights dequantized a block of rows at a time into an fp32
  scratch and multiplied with MKL's sgemm: exact, and 1.2x the int8 GEMM with oneDNN
  held to AVX2.

The scratch buffers are shared by every layer, since only the engine thread runs them,
one at a time.
"""

from __future__ import annotations

from typing import Callable

import torch

from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS as BLOCK_ROWS  # the kernel layout's row blocks
from engine.forward.native.build import address, library as native_kernels
from engine.host.cpu_features import has_bf16_matmul, has_int8_dot

PROMPT_ROWS = 128
"""Rows from which the int8 and fp32 GEMMs pay: at 128 the fp32 GEMM was 1.1-1.4x the kernel's speed on an 8B
model's matrices, at 96 level or slower."""
BF16_PROMPT_ROWS = 48
"""Rows from which the bf16 GEMM pays: against Hearth's int4 kernel (two codes an activation, one in a batched step)
on SmolLM2-1.7B's matrices, 16384x2048 at 48 rows 12.0 ms against 14.0 (8.7), at 64 12.5 against 18.3 (11.4);
2048x8192 at 48 rows 4.8 against 8.1 (5.2)."""
SCRATCH_WEIGHTS = 2**24
"""Weights multiplied at a time: 16 MiB of int8."""
FP32_SCRATCH_WEIGHTS = 2**22
"""Weights dequantized at a time for the fp32 GEMM, 16 MiB: 5-15 % faster than 64 MiB (an 8B model's shapes at 512
rows)."""
BF16_SCRATCH_WEIGHTS = 2**22
"""Weights dequantized at a time for the bf16 GEMM, 8 MiB: 2^21 to 2^23 ran level on SmolLM2-1.7B's shapes at 512 rows,
2^20 and 2^24 up to 1.4x slower."""
UNPACKED_WEIGHTS = 2**22
"""Weights unpacked at a time, 8 MiB of int16 codes: unpacking 16 M weights took 16-18 ms so, 20-22 at 1 M a time
and 17-25 at 16 M (2 threads, in one process)."""
FIXED_BITS = 8  # a group's scale over its row's, in int16 fixed point: (q - 8) * factor, at most 127 * 2**8, fits
LOW_STEPS = 254  # an activation's second code counts in steps of 1/254 of its first's


class _Scratch:
    """A reused buffer of one dtype, grown to the largest block asked for; made again outside inference mode where
    it was made inside (such a tensor cannot be written there)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._buffer = torch.empty(0, dtype=dtype)

    def take(self, size: int) -> torch.Tensor:
        if self._buffer.numel() < size or (self._buffer.is_inference() and not torch.is_inference_mode_enabled()):
            self._buffer = torch.empty(size, dtype=self._buffer.dtype)
        return self._buffer[:size]


_CODES, _WEIGHTS, _FP32_WEIGHTS = _Scratch(torch.int16), _Scratch(torch.int8), _Scratch(torch.float32)
_BF16_WEIGHTS = _Scratch(torch.bfloat16)


def covers(rows: int) -> bool:
    """Whether a weight of ``rows`` rows takes this path: whole blocks of the kernel's layout only."""
    return rows % BLOCK_ROWS == 0


ScalesOfRows = Callable[[int, int], torch.Tensor]  # (start, end) -> those rows' scales and zeros [K / group, n, 2]


def runs_in_bf16() -> bool:
    """Whether prompts multiply in bf16 here: AMX's bf16 tiles, and Hearth's kernels to dequantize the weights."""
    return has_bf16_matmul() and native_kernels() is not None


def prompt_rows() -> int:
    """Rows from which a call takes this module's GEMM rather than the int4 kernel."""
    return BF16_PROMPT_ROWS if runs_in_bf16() else PROMPT_ROWS


def takes(rows: int) -> bool:
    """Whether a call of ``rows`` rows takes this module's GEMM; a decode step's few rows answer without reading
    the CPU's features (a decode step of SmolLM2-135M makes 120 such calls)."""
    return rows >= min(BF16_PROMPT_ROWS, PROMPT_ROWS) and rows >= prompt_rows()


def prompt_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``x`` [M, K] fp32 times the weight [N, K] that ``packed`` [N, K / 2] uint8 (the CPU kernel's layout) and
    the scales and zeros bf16 hold, ``w = (q - 8) * scale + zero``; [M, N] fp32. ``scales_of_rows``: a block of rows'
    scales and zeros, wherever they are kept (``native.int4_matmul`` keeps them in blocks of its own)."""
    if runs_in_bf16():
        return bf16_matmul(x, packed, scales_of_rows, group)
    multiply = int8_matmul if has_int8_dot() else fp32_matmul
    return multiply(x, packed, scales_of_rows, group)


def bf16_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``prompt_matmul`` in bf16 (the module docstring): ``BF16_SCRATCH_WEIGHTS`` dequantized at a time."""
    rows, width, length = packed.shape[0], packed.shape[1] * 2, x.shape[0]
    activations = x.to(torch.bfloat16)  # [M, K]
    out = torch.empty(length, rows)  # [M, N]
    step = max(BLOCK_ROWS, BF16_SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        weights_t = _bf16_weights(packed, scales_of_rows(start, end), group, start, end)  # [K, n]
        out[:, start:end].copy_(torch.mm(activations, weights_t))  # [M, n]
    return out


def _bf16_weights(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, start: int,
                  end: int) -> torch.Tensor:
    """Rows ``start`` … ``end`` of ``packed`` [N, K / 2] (whole blocks), their scales and zeros [G, n, 2] bf16,
    dequantized into the scratch as bf16, transposed: [K, n]."""
    width, groups = packed.shape[1] * 2, scales_and_zeros.shape[0]
    pairs = scales_and_zeros.view(groups, -1, BLOCK_ROWS, 2).transpose(0, 1).contiguous()  # [n / 64, G, 64, 2]
    weights_t = _BF16_WEIGHTS.take(width * (end - start)).view(width, end - start)
    native_kernels().int4_dequantize_bf16(address(packed), address(pairs), width, group, start // BLOCK_ROWS,
                                          (end - start) // BLOCK_ROWS, address(weights_t))
    return weights_t


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``prompt_matmul`` in int8 (the module docstring)."""
    rows, width, length = packed.shape[0], packed.shape[1] * 2, x.shape[0]
    codes, x_scales = _activation_codes(x)  # [2M, K] int8, [M, 1]
    group_sums = x.view(length, -1, group).sum(-1)  # [M, G]: each group's zero point times its sum, exactly
    out = torch.empty(length, rows)  # [M, N]
    step = max(BLOCK_ROWS, SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        scales_and_zeros = scales_of_rows(start, end)  # [G, n, 2]
        weights, w_scales = _int8_weights(packed[start:end], scales_and_zeros, group)  # [K, n], [n]
        sums = torch._int_mm(codes, weights)  # [2M, n] int32: the high codes' products, then the low codes'
        block = out[:, start:end].copy_(sums[length:]).div_(LOW_STEPS).add_(sums[:length])
        block.mul_(w_scales).mul_(x_scales).addmm_(group_sums, scales_and_zeros[..., 1].float())
    return out


def _activation_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] as int8 codes [2M, K] (the high codes' rows, then the low ones') and row scales [M, 1]:
    ``x ≈ scale * (high + low / LOW_STEPS)``."""
    length = x.shape[0]
    scales = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_min_(1e-30).div_(127)  # [M, 1]
    scaled = x / scales  # [M, K] in [-127, 127]
    high = scaled.round()
    codes = torch.empty(2 * length, x.shape[1], dtype=torch.int8)
    codes[:length].copy_(high)
    codes[length:].copy_(scaled.sub_(high).mul_(LOW_STEPS).round_())  # in [-127, 127]
    return codes, scales


def _int8_weights(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``packed`` [n, K / 2] as int8 [K, n] in the scratch, ``(q - 8) * scale / row scale`` rounded,
    and the row scales [n] fp32 (its largest group's scale times 8 / 127); unpacked ``UNPACKED_WEIGHTS`` at a
    time."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    scales = scales_and_zeros[..., 0].float()  # [G, n]
    row_scales = scales.abs().amax(0).clamp_min_(1e-30).mul_(8 / 127)  # [n]: |q - 8| <= 8
    factors = torch.round(scales * ((1 << FIXED_BITS) / row_scales))  # [G, n]
    offsets = (1 << (FIXED_BITS - 1)) - 8 * factors  # q - 8, and half a step: the shift rounds
    weights = _WEIGHTS.take(rows * width).view(width // group, group, rows // BLOCK_ROWS, BLOCK_ROWS)
    step = max(BLOCK_ROWS, UNPACKED_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        codes = _unpacked(packed[start:end], factors[:, start:end], offsets[:, start:end], group, _CODES)
        codes.bitwise_right_shift_(FIXED_BITS)  # [n' / 64, G, group, 64]: the int8 weights, in int16
        weights[:, :, start // BLOCK_ROWS : end // BLOCK_ROWS].copy_(codes.permute(1, 2, 0, 3))
    return weights.view(width, rows), row_scales  # [G, group, n / 64, 64]: column k of the weight, row by row


def _unpacked(packed: torch.Tensor, factors: torch.Tensor, offsets: torch.Tensor, group: int,
              scratch: _Scratch) -> torch.Tensor:
    """Rows of ``packed`` [n, K / 2] as ``q * factor + offset`` of their groups (factors and offsets [G, n]) in the
    scratch, in its dtype: [n / 64, G, group, 64]."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    blocks, groups = rows // BLOCK_ROWS, width // group
    nibbles = packed.view(blocks, groups, group, BLOCK_ROWS // 2)  # byte (k, j): row j's code low, row j + 32's high
    values = scratch.take(rows * width).view(blocks, groups, group, BLOCK_ROWS)
    values[..., : BLOCK_ROWS // 2].copy_(nibbles & 15)
    values[..., BLOCK_ROWS // 2 :].copy_(nibbles >> 4)
    return values.mul_(_per_block(factors, blocks, values.dtype)).add_(_per_block(offsets, blocks, values.dtype))


def fp32_matmul(x: torch.Tensor, packed: torch.Tensor, scales_of_rows: ScalesOfRows, group: int) -> torch.Tensor:
    """``prompt_matmul`` exactly, on MKL's sgemm: the weights dequantized ``FP32_SCRATCH_WEIGHTS`` at a time."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(x.shape[0], rows)  # [M, N]
    step = max(BLOCK_ROWS, FP32_SCRATCH_WEIGHTS // width // BLOCK_ROWS * BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        weights_t = _dequantized(packed[start:end], scales_of_rows(start, end), group)  # [n / 64, K, 64]
        product = torch.matmul(x, weights_t)  # [n / 64, M, 64]: each block's 64 columns of the result
        out[:, start:end].view(x.shape[0], -1, BLOCK_ROWS).copy_(product.transpose(0, 1))
    return out


def _dequantized(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The rows of ``packed`` [n, K / 2] as fp32 in the scratch, each block of 64 transposed, [n / 64, K, 64]."""
    scales = scales_and_zeros[..., 0].float()  # [G, n]
    offsets = scales_and_zeros[..., 1].float() - 8 * scales  # (q - 8) * scale + zero = q * scale + offset
    weights = _unpacked(packed, scales, offsets, group, _FP32_WEIGHTS)  # [n / 64, G, group, 64]
    return weights.view(weights.shape[0], -1, BLOCK_ROWS)


def _per_block(values: torch.Tensor, blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """[G, n] group values as [n / 64, G, 1, 64] in ``dtype``, to scale a block's [G, group, 64] codes."""
    groups = values.shape[0]
    return values.t().reshape(blocks, BLOCK_ROWS, groups).transpose(1, 2).unsqueeze(2).to(dtype)
