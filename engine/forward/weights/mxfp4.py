"""Weights kept as MXFP4 blocks, gpt-oss's experts as its GGUF files store them, and their matmul (engine thread).

A block of 32 weights of a row is 17 bytes (gguf-py's ``MXFP4``, llama.cpp's ``block_mxfp4``): an e8m0 exponent
``e``, then 16 bytes whose low nibble ``j`` is weight ``j``'s e2m1 code and high nibble weight ``j + 16``'s; a weight
is ``HALVES[code] * 2^(e - 128)``. They stay these bytes in memory, 4.25 bits a weight (the x86 kernels take them
rearranged in strips of 8 rows, ``in_strips``): Hearth's int4 groups (16 evenly spaced values and a bf16 scale and
zero per 32, 5 bits a weight) would hold them 18% larger and inexactly, since e2m1's 15 values (0, ±0.5, ±1, ±1.5,
±2, ±3, ±4, ±6) are not evenly spaced.

Hearth's CPU kernel (``native`` ``mxfp4_matmul``) turns each block's codes into int8 through a 16-entry table (twice
the e2m1 values, exact) and multiplies them by the activations rounded to int8 codes per block of 32, as the int4
kernel rounds them (two codes a value for a one-row call of one sequence, a decode step's, ``activation_codes``;
one, as llama.cpp's Q8_0, in a batched step and from ``ONE_CODE_ROWS`` rows on): int8 dot products sum each block
exactly, and its weight and activation scales meet the sum in fp32. The fp32 plan keeps the activations in fp32
(``exact``), for products of the exact weights; without the kernels each call decodes the weight in PyTorch's ops.
openai's checkpoints (transformers' ``GptOssForCausalLM`` folders) hold the same numbers as blocks and scales
apart, each byte two consecutive weights (``from_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.forward.native import activation_codes
from engine.forward.native.build import activation_scratch, kernels, library
from engine.forward.native.int4_matmul import AMX_ROWS, runs_on_amx, tile_scratch

BLOCK, BLOCK_BYTES = 32, 17
STRIP = 8  # weight rows a strip (``in_strips``)
AMX_STRIP = 32  # weight rows the tiles' kernel dequantizes at a time: a weight's rows a whole number of them
ONE_CODE_ROWS = 2
"""Rows from which a call rounds its activations to one code a value whatever the step (an expert's rows of a prompt
chunk or a batched step): each block's products then meet their scales in fp32 once per activation row rather than
twice, which made two codes slower than fp32 activations from two rows on (one avx512 thread, 5760 x 2880: 1.4 ms
against 1.1 at 2 rows, 6.4 against 4.5 at 8); one code is as fast as fp32 or faster there."""
HALVES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)  # 2 x e2m1


@dataclass(frozen=True)
class Mxfp4Rows:
    """A weight [N, K] as its MXFP4 blocks, ``blocks`` [N, K / 32 * 17] uint8 (see the module docstring).
    ``handed_over``: the blocks are this object's alone, read for it at load, and go to one matmul, which may then
    rearrange them in place (``in_strips``); nothing reads this object after."""

    blocks: torch.Tensor
    handed_over: bool = False

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
        ``2^(e - 128)`` times ``HALVES``), in GGUF's blocks: the same codes and exponents, the nibbles reordered; new
        blocks, handed over."""
        codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [N, B, 32]: weights in order
        packed = codes[..., :16] | codes[..., 16:] << 4  # [N, B, 16]: weight j low, j + 16 high
        return Mxfp4Rows(torch.cat([scales.unsqueeze(-1), packed], dim=-1).flatten(1), handed_over=True)  # [N, B * 17]

    def dequantize(self) -> torch.Tensor:
        """The weight in fp32, [N, K]: exactly what the blocks stand for."""
        rows = self.blocks.shape[0]
        blocks = self.blocks.view(rows, -1, BLOCK_BYTES)  # [N, B, 17]
        exponents = blocks[..., 0].to(torch.int32) - 128  # [N, B]
        codes = blocks[..., 1:]  # [N, B, 16]
        values = HALVES.to(blocks.device)[torch.cat([codes & 0x0F, codes >> 4], dim=-1).long()]  # [N, B, 32]
        return torch.ldexp(values, exponents.unsqueeze(-1)).view(rows, -1)


def in_strips(weight: Mxfp4Rows) -> torch.Tensor:
    """The weight's blocks rearranged by and for the x86 kernels (``Variant.mxfp4_strips``): [ceil(N / 8), K / 32 *
    136], the same bytes a strip of 8 weight rows at a time (the last padded with zero blocks, whose weights are zero)
    and within a strip a block column at a time: its 8 exponents (row r's at r), then its 128 code bytes, byte
    32j + 4r + i row r's code byte 4j + i. A vector of 32 code bytes then holds four weights of each of 8 rows, which
    one row of activations meets in one product. In place where the blocks are ``handed_over`` and whole strips:
    writing a copy's fresh pages took most of gpt-oss-20b's 9 s of rearranging at load."""
    blocks = weight.blocks.contiguous()
    rows, row_bytes = blocks.shape
    in_place = weight.handed_over and rows % STRIP == 0 and weight.blocks.is_contiguous()
    strips = (blocks.view(rows // STRIP, row_bytes * STRIP) if in_place
              else torch.empty(-(-rows // STRIP), row_bytes * STRIP, dtype=torch.uint8))  # [S, B * 136]
    library().mxfp4_strips_from_rows(blocks.data_ptr(), rows, row_bytes // BLOCK_BYTES * BLOCK, strips.data_ptr())
    return strips


class Mxfp4Matmul:
    """``y = (x * input_scale) @ W.T + bias`` over ``weight``'s blocks, x and y fp32 (``mxfp4_linear``'s call). The
    kernel rounds the activations to int8 codes (``codes_for`` its rows), or with ``exact`` keeps them in fp32 (the
    module docstring)."""

    def __init__(self, weight: Mxfp4Rows, bias: torch.Tensor | None, input_scale: torch.Tensor | None,
                 exact: bool) -> None:
        self.rows, self.width = weight.shape
        self.bias = bias.float().contiguous() if bias is not None else None
        self.input_scale, self.exact = input_scale, exact
        self._kernels = library() if weight.device.type == "cpu" else None
        strips = self._kernels is not None and kernels().mxfp4_strips
        self.blocks = in_strips(weight) if strips else weight.blocks.contiguous()  # as the kernels read them
        self._on_tiles = self._kernels is not None and not exact and runs_on_amx() and self.rows % AMX_STRIP == 0

    @property
    def joins_experts(self) -> bool:
        """Whether ``Mxfp4Experts`` can make this call among its layer's others: Hearth's kernels, rounded
        activations, none scaled."""
        return self._kernels is not None and not self.exact and self.input_scale is None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() if self.input_scale is None else x * self.input_scale
        if self._kernels is None:
            return torch.nn.functional.linear(x, Mxfp4Rows(self.blocks).dequantize(), self.bias)
        x = x.contiguous()
        length = x.shape[0]
        if self._on_tiles and length >= AMX_ROWS:
            return _on_tiles(x, self.blocks, self.rows, self.bias)
        out = torch.empty(length, self.rows)  # [M, N]
        codes = 0 if self.exact else codes_for(length)
        self._kernels.mxfp4_matmul(x.data_ptr(), length, self.width, self.blocks.data_ptr(), self.rows,
                                   self.bias.data_ptr() if self.bias is not None else None, codes,
                                   activation_scratch(length, self.width, BLOCK, starts=True), out.data_ptr())
        return out


def codes_for(rows: int) -> int:
    """The int8 codes a value a kernel call over ``rows`` activation rows rounds to: one from ``ONE_CODE_ROWS`` on,
    else the step's (``activation_codes``)."""
    return 1 if rows >= ONE_CODE_ROWS else activation_codes.codes()


def mxfp4_linear(weight: Mxfp4Rows, bias: torch.Tensor | None, input_scale: torch.Tensor | None,
                 exact: bool = False) -> tuple[Mxfp4Matmul, int]:
    """The call ``y = (x * input_scale) @ W.T + bias`` over ``weight``'s blocks (``Mxfp4Matmul``) and the bytes it
    holds."""
    matmul = Mxfp4Matmul(weight, bias, input_scale, exact)
    return matmul, matmul.blocks.numel() + (matmul.bias.numel() * 4 if matmul.bias is not None else 0)


class Mxfp4Experts:
    """A layer's experts' matmuls of one shape (gate and up's, or down's) as one kernel call over a step's rows
    grouped by expert (``native`` ``mxfp4_experts``): one OpenMP pass over every active expert's weight rows, the
    activations rounded once, where a call an expert paid its own fixed costs and its threads' wait for each other."""

    def __init__(self, matmuls: Sequence[Mxfp4Matmul]) -> None:
        """``matmuls``: each expert's, in the router's order, of one shape, each ``joins_experts``."""
        self.rows, self.width = matmuls[0].rows, matmuls[0].width
        self._matmuls = tuple(matmuls)  # keep the blocks and biases the table points at
        self._table = torch.tensor([[m.blocks.data_ptr(), m.bias.data_ptr() if m.bias is not None else 0]
                                    for m in matmuls], dtype=torch.int64)  # [E, 2]: blocks, bias (0: none)

    @staticmethod
    def of(matmuls: Sequence[Mxfp4Matmul | None]) -> Mxfp4Experts | None:
        """The experts' matmuls as one call, or None where any is not an ``Mxfp4Matmul`` that joins others."""
        if not matmuls or not all(m is not None and m.joins_experts for m in matmuls):
            return None
        if len({(m.rows, m.width) for m in matmuls}) != 1:  # type: ignore[union-attr]
            return None
        return Mxfp4Experts(matmuls)  # type: ignore[arg-type]

    def __call__(self, x: torch.Tensor, active: torch.Tensor, counts: torch.Tensor, codes: int) -> torch.Tensor:
        """``x`` [S, K]: the rows of each expert in ``active`` [A] (int64, in order), ``counts`` [A] (int64) of them
        one after another; each times its expert's weight, [S, N] fp32. ``codes``: 1 or 2 a value
        (``activation_codes``)."""
        x = x.float().contiguous()
        length = x.shape[0]
        table = torch.cat([self._table.index_select(0, active), counts.unsqueeze(1)], dim=1).contiguous()  # [A, 3]
        out = torch.empty(length, self.rows)  # [S, N]
        library().mxfp4_experts(x.data_ptr(), length, self.width, table.data_ptr(), active.numel(), self.rows, codes,
                                activation_scratch(length, self.width, BLOCK, starts=True), out.data_ptr())
        return out


def _on_tiles(x: torch.Tensor, blocks: torch.Tensor, rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [M, K] fp32 times the blocks' weight [N, K] on AMX's bf16 tiles, [M, N] fp32 (the module docstring)."""
    length, width = x.shape
    activations, threads, tiles = tile_scratch(length, width)
    out = torch.empty(length, rows)  # [M, N]
    library().mxfp4_matmul_amx(x.data_ptr(), length, width, activations, blocks.data_ptr(), rows, threads, tiles,
                               out.data_ptr())
    return out if bias is None else out.add_(bias)
