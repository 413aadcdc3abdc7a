"""Rows times 8-bit weights in groups of 32, with VNNI's int8 dot products (engine thread).

The CPU's output layer beside 4-bit layers: it only ever multiplies the rows that are
sampled (one a sequence), so its bytes are read once a decode step and set its cost.
FBGEMM's fp16 copy of SmolLM2-135M's tied table pads its 576 columns to 1 024 (101 MB);
here it holds 30 MB, and a GGUF file's Q8_0 table comes back exactly (each block's
fp16 scale is the group's). A Q8_0 file's layers run here alone, prompts included
(``format_plan.eight_bit_prompts_faster``). Each weight is ``q * scale``, ``|q| <= 127``,
stored as the byte ``q + 128`` (``vpdpbusd`` multiplies unsigned by signed bytes), and
each group's activation codes, summed, take the offset out. Activations are one or two
int8 codes a value as ``activation_codes`` says for the step and the call's rows, as for
``int4_matmul``: a prompt chunk's one code runs at 2.6-3x FBGEMM's fp16 rate on AVX-512
with VNNI, 1.1x on AVX2 alone (docs/performance.md).
"""

from __future__ import annotations

import torch

from engine.forward.native import activation_codes, gguf_layout
from engine.forward.native.build import activation_scratch, address, library
from engine.forward.weights.packed_sizes import INT8_BLOCK_ROWS as BLOCK_ROWS
from engine.forward.weights.packed_sizes import INT8_GROUP as GROUP
from engine.forward.weights.packed_sizes import int8_bytes, int8_kernel_takes
from engine.forward.weights.int8_groups import Int8Groups
from engine.forward.weights.row_chunks import RowChunks

CODES_PER_DOT = 4  # columns a 32-bit lane of ``vpdpbusd`` takes
OFFSET = 128  # added to each code, so it is an unsigned byte
CHUNK_ROWS = 4096  # rows quantized at a time (a multiple of BLOCK_ROWS)


def covers(rows: int, width: int) -> bool:
    """Whether a weight [rows, width] runs here: whole blocks of rows and whole groups of columns."""
    return library() is not None and int8_kernel_takes(rows, width)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] as codes q [N, K] int8 and scales [N, K / 32] fp16, ``w ≈ q * scale``: each group's largest
    magnitude maps to 127 (a Q8_0 block's own scale, so its codes come back as they were)."""
    rows, width = weight.shape
    groups = weight.float().view(rows, width // GROUP, GROUP)  # [N, G, 32]
    scales = (groups.abs().amax(dim=-1) / 127).to(torch.float16)  # [N, G]
    divisor = scales.float().unsqueeze(-1)  # [N, G, 1]
    codes = torch.where(divisor > 0, groups / divisor.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    return codes.round_().clamp_(-127, 127).to(torch.int8).view(rows, width), scales


class Int8Matmul:
    """``x`` [M, K] fp32 times a weight [N, K] held as int8 codes in groups of 32 (``quantize``): [M, N] fp32.
    ``nbytes``: what it holds. The weight is quantized and laid out ``CHUNK_ROWS`` rows at a time, so its
    temporaries stay the size of a chunk (a 152 064-row output layer is 2.2 GB in fp32); ``RowChunks`` (a GGUF
    file's blocks) are decoded a chunk at a time too, and ``Int8Groups`` (a file's Q8_0 blocks) laid out as they
    are."""

    def __init__(self, weight: torch.Tensor | RowChunks | Int8Groups) -> None:
        rows, width = weight.shape
        self._packed = torch.empty(rows // BLOCK_ROWS, width // CODES_PER_DOT, 4, 16, CODES_PER_DOT, dtype=torch.uint8)
        self._scales = torch.empty(rows // BLOCK_ROWS, width // GROUP, BLOCK_ROWS, dtype=torch.float16)
        for start in range(0, rows, CHUNK_ROWS):
            self._lay_out(weight[start : start + CHUNK_ROWS], start // BLOCK_ROWS)
        self._kernel, self._rows = library().int8_matmul, rows
        self._addresses = (address(self._packed), address(self._scales))
        self.nbytes = int8_bytes(rows, width)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The weight's rows ``token_ids`` [S] as the kernel multiplies them (``q * scale``), [S, K] fp32: a tied
        token table's lookup, from the codes the output layer holds rather than a second copy of the table."""
        blocks, within = token_ids // BLOCK_ROWS, token_ids % BLOCK_ROWS  # [S] each
        vectors, lanes = within // 16, within % 16  # a block's four vectors of 16 rows
        codes = self._packed[blocks, :, vectors, lanes]  # [S, K/4, 4]: q + 128
        scales = self._scales[blocks, :, within].float()  # [S, K/32]
        q = codes.reshape(len(token_ids), -1, GROUP).to(torch.int16) - OFFSET  # [S, K/32, 32]
        return (q.float() * scales.unsqueeze(-1)).flatten(1)  # [S, K]

    def _lay_out(self, weight: torch.Tensor | Int8Groups, first_block: int) -> None:
        """Rows of the weight [n, K] (whole blocks), from block ``first_block`` on, into the kernel's layout in one
        pass of C where it is built (``gguf_layout``: fp32 rows quantized, int8 groups as they are), else in PyTorch's
        ops, which give the same bytes."""
        rows, width = weight.shape
        blocks, steps = rows // BLOCK_ROWS, width // CODES_PER_DOT
        packed, scales = self._packed[first_block : first_block + blocks], self._scales[first_block : first_block + blocks]
        grouped = isinstance(weight, Int8Groups)
        if gguf_layout.available():
            if grouped:
                gguf_layout.int8_layout_from_codes(weight.codes, weight.scales, packed, scales)
            else:
                gguf_layout.int8_layout(weight, packed, scales)
            return
        codes, group_scales = (weight.codes, weight.scales.to(torch.float16)) if grouped else quantize(weight)
        shifted = codes.view(torch.uint8) ^ OFFSET  # [n, K]: q + 128 as a byte
        # [n/64, 4, 16, K/4, 4] -> [n/64, K/4, 4, 16, 4]: four columns of 16 rows in a vector, four vectors a block
        packed.copy_(shifted.view(blocks, 4, 16, steps, CODES_PER_DOT).permute(0, 3, 1, 2, 4))
        scales.copy_(group_scales.view(blocks, BLOCK_ROWS, -1).transpose(1, 2))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        length, width = x.shape
        scratch = activation_scratch(length, width, GROUP)
        out = torch.empty(length, self._rows)
        self._kernel(x.data_ptr(), length, width, *self._addresses, self._rows,
                     activation_codes.codes_for_rows(length), scratch, out.data_ptr())
        return out
