"""Weights kept as MXFP4 blocks, gpt-oss's experts as its GGUF files store them, and their matmul (engine thread).

A block of 32 weights of a row is 17 bytes (gguf-py's ``MXFP4``, llama.cpp's ``block_mxfp4``): an e8m0 exponent
``e``, then 16 bytes whose low nibble ``j`` is weight ``j``'s e2m1 code and high nibble weight ``j + 16``'s; a weight
is ``HALVES[code] * 2^(e - 128)``. They stay so in memory, 4.25 bits a weight: Hearth's int4 groups (16 evenly
spaced values and a bf16 scale and zero per 32, 5 bits a weight) would hold them 18% larger and inexactly, since
e2m1's 15 values (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6) are not evenly spaced.

Hearth's CPU kernel (``native`` ``mxfp4_matmul``) turns each block's codes into int8 through a 16-entry table (twice
the e2m1 values, exact) and multiplies them by the activations rounded to int8 codes per block of 32, as the int4
kernel rounds them (two codes a value for a one-row call of one sequence, a decode step's, ``activation_codes``;
one, as llama.cpp's Q8_0, in a batched step and from ``ONE_CODE_ROWS`` rows on): int8 dot products sum each block
exactly, and its weight and activation scales meet the sum in fp32. The fp32 plan keeps the activations in fp32 (``exact``), for products of the exact weights; without the
kernels each call decodes the weight in PyTorch's ops.
openai's checkpoints (transformers' ``GptOssForCausalLM`` folders) hold the same numbers as blocks and scales
apart, each byte two consecutive weights (``from_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.forward.native import activation_codes
from engine.forward.native.build import activation_scratch, library
from engine.forward.native.int4_matmul import AMX_ROWS, runs_on_amx, tile_scratch

BLOCK, BLOCK_BYTES = 32, 17
AMX_STRIP = 32  # weight rows the tiles' kernel dequantizes at a time: a weight's rows a whole number of them
ONE_CODE_ROWS = 2
"""Rows from which a call rounds its activations to one code a value whatever the step (an expert's rows of a prompt
chunk or a batched step): each block's products then meet their scales in fp32 once per activation row rather than
twice, which made two codes slower than fp32 activations from two rows on (one avx512 thread, 5760 x 2880: 1.4 ms
against 1.1 at 2 rows, 6.4 against 4.5 at 8); one code is as fast as fp32 or faster there."""
HALVES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)  # 2 x e2m1


@dataclass(frozen=True)
class Mxfp4Rows:
    """A weight [N, K] as its MXFP4 blocks, ``blocks`` [N, K / 32 * 17] uint8 (see the module docstring)."""

    blocks: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.blocks.shape[0], self.blocks.shape[1] // BLOCK_BYTES * BLOCK))

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def to(self, device: torch.device) -> Mxfp4Rows:
        return Mxfp4Rows(self.blocks.to(device))

    @staticmethod
    def cat(parts: Sequence[Mxfp4Rows]) -> Mxfp4Rows:
        """The parts' rows one after another (gate's, then up's)."""
        return Mxfp4Rows(torch.cat([part.blocks for part in parts]))

    @staticmethod
    def from_checkpoint(blocks: torch.Tensor, scales: torch.Tensor) -> Mxfp4Rows:
        """openai's MXFP4 rows, ``blocks`` [N, K / 32, 16] uint8 (byte j: weight 2j in its low nibble, 2j + 1 in its
        high one) and ``scales`` [N, K / 32] uint8 (e8m0, bias 127: ``2^(e - 127)`` times the e2m1 value, which is
        ``2^(e - 128)`` times ``HALVES``), in GGUF's blocks: the same codes and exponents, the nibbles reordered."""
        codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [N, B, 32]: weights in order
        packed = codes[..., :16] | codes[..., 16:] << 4  # [N, B, 16]: weight j low, j + 16 high
        return Mxfp4Rows(torch.cat([scales.unsqueeze(-1), packed], dim=-1).flatten(1))  # [N, B * 17]

    def dequantize(self) -> torch.Tensor:
        """The weight in fp32, [N, K]: exactly what the blocks stand for."""
        rows = self.blocks.shape[0]
        blocks = self.blocks.view(rows, -1, BLOCK_BYTES)  # [N, B, 17]
        exponents = blocks[..., 0].to(torch.int32) - 128  # [N, B]
        codes = blocks[..., 1:]  # [N, B, 16]
        values = HALVES.to(blocks.device)[torch.cat([codes & 0x0F, codes >> 4], dim=-1).long()]  # [N, B, 32]
        return torch.ldexp(values, exponents.unsqueeze(-1)).view(rows, -1)


def mxfp4_linear(weight: Mxfp4Rows, bias: torch.Tensor | None, input_scale: torch.Tensor | None,
                 exact: bool = False) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """``y = (x * input_scale) @ W.T + bias`` over ``weight``'s blocks, x and y fp32: the call and the bytes held.
    The kernel rounds the activations to int8 codes (``activation_codes.codes()`` a value), or with ``exact`` keeps
    them in fp32 (the module docstring)."""
    blocks = weight.blocks.contiguous()
    rows, width = weight.shape
    bias = bias.float().contiguous() if bias is not None else None
    kernels = library() if blocks.device.type == "cpu" else None
    nbytes = blocks.numel() + (bias.numel() * 4 if bias is not None else 0)

    on_tiles = kernels is not None and not exact and runs_on_amx() and rows % AMX_STRIP == 0

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.float() if input_scale is None else x * input_scale
        if kernels is None:
            return torch.nn.functional.linear(x, Mxfp4Rows(blocks).dequantize(), bias)
        x = x.contiguous()
        length = x.shape[0]
        if on_tiles and length >= AMX_ROWS:
            return _on_tiles(x, blocks, rows, bias)
        out = torch.empty(length, rows)  # [M, N]
        codes = 0 if exact else 1 if length >= ONE_CODE_ROWS else activation_codes.codes()
        kernels.mxfp4_matmul(x.data_ptr(), length, width, blocks.data_ptr(), rows,
                             bias.data_ptr() if bias is not None else None, codes,
                             activation_scratch(length, width, BLOCK, lanes=True), out.data_ptr())
        return out

    return run, nbytes


def _on_tiles(x: torch.Tensor, blocks: torch.Tensor, rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [M, K] fp32 times the blocks' weight [N, K] on AMX's bf16 tiles, [M, N] fp32 (the module docstring)."""
    length, width = x.shape
    activations, threads, tiles = tile_scratch(length, width)
    out = torch.empty(length, rows)  # [M, N]
    library().mxfp4_matmul_amx(x.data_ptr(), length, width, activations, blocks.data_ptr(), rows, threads, tiles,
                               out.data_ptr())
    return out if bias is None else out.add_(bias)
