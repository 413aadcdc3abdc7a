"""The byte layout of the CPU's int4 kernel (``_weight_int4pack_mm_for_cpu``), made from codes or straight from
a 4-bit GGUF file's nibbles, and codes back from it (engine thread).

Each block of ``CPU_INT4_PACK_ROWS`` (64) rows of a weight [N, K] is [K, 32] bytes,
byte (k, j) holding row j's code k in its low nibble and row j + 32's in its high one,
as ``_convert_weight_to_int4pack_for_cpu`` lays it out. That op takes the codes as
int32, a copy four times their size that a large model's load would spend much of
its time on, so whole blocks are laid out here from the codes in their own byte width,
and a 4-bit GGUF file's blocks go there without codes at all: llama.cpp keeps two codes
a byte too, so a block of rows takes two shifts and masks of its bytes and one
transposing copy, much less work than decoding them into codes and packing those; where Hearth's
kernels are built, one pass in C instead (``native``), faster still.

That is the layout of PyTorch's AVX-512 build of the kernel, and the one every variant of Hearth's int4 kernel
takes; PyTorch's AVX2 and plain builds (a laptop's CPU, or ``ATEN_CPU_CAPABILITY=avx2``) block the rows otherwise,
so where neither Hearth's kernels nor that build run (``laid_out_here``), the op lays the codes out and nothing here
writes or reads its bytes.
"""

from __future__ import annotations

import torch

from engine.forward.native.build import library
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS

HALF = CPU_INT4_PACK_ROWS // 2  # rows whose codes a byte's low nibbles hold; the next as many take the high ones


def torch_takes_this_layout() -> bool:
    """Whether PyTorch's CPU int4 kernel takes the bytes laid out here (its AVX-512 build)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def laid_out_here(rows: int) -> bool:
    """Whether a weight of ``rows`` rows is kept in this layout: whole blocks, where Hearth's int4 kernel runs (any
    variant) or PyTorch's kernel takes the layout."""
    return rows % CPU_INT4_PACK_ROWS == 0 and (library() is not None or torch_takes_this_layout())


def packed_from_codes(q: torch.Tensor, tiles: int) -> torch.Tensor:
    """q [N, K] in 0…15 as the kernel's bytes [N, K / 2] uint8; a last block of fewer than 64 rows, or every row
    where PyTorch's kernel takes another layout and Hearth's does not take these rows, goes through the op."""
    if not torch_takes_this_layout() and not laid_out_here(q.shape[0]):
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), tiles)
    rows, width = q.shape
    whole = rows // CPU_INT4_PACK_ROWS * CPU_INT4_PACK_ROWS
    codes = q.to(torch.uint8)
    blocks = codes[:whole].view(-1, CPU_INT4_PACK_ROWS, width)  # [N / 64, 64, K]
    nibbles = torch.bitwise_left_shift(blocks[:, HALF:], 4).bitwise_or_(blocks[:, :HALF])  # [N / 64, 32, K]
    packed = _transposed(nibbles).view(whole, width // 2)  # [N / 64 * 64, K / 2]
    if whole == rows:
        return packed
    rest = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[whole:].to(torch.int32), tiles)
    return torch.cat([packed, rest])


def packed_from_nibbles(nibbles: torch.Tensor, out: torch.Tensor) -> None:
    """A 4-bit GGUF type's nibble bytes of n rows (a multiple of 64), [n, R, L] uint8 (any strides), into the
    kernel's bytes ``out`` [n, K / 2]: byte (r, i) of a row holds its weight 2Lr + i in its low nibble and
    2Lr + L + i in its high one (Q4_0, Q4_1: runs of 16 bytes per block of 32; Q4_K: four runs of 32 per block of
    256)."""
    rows, runs, length = nibbles.shape
    kernels = library()
    if kernels is not None and out.is_contiguous():  # one pass in C (``native``): about half the time
        nibbles = nibbles if nibbles.stride(2) == 1 else nibbles.contiguous()
        kernels.int4_layout_from_nibbles(nibbles.data_ptr(), rows, runs, length, nibbles.stride(0), nibbles.stride(1),
                                         out.data_ptr())
        return
    blocks = nibbles.view(rows // CPU_INT4_PACK_ROWS, 2, HALF, runs, length)  # [B, 2, 32, R, L]
    low_rows, high_rows = blocks.unbind(1)  # [B, 32, R, L] each: rows j and j + 32 of each block
    pairs = torch.empty(*low_rows.shape[:3], 2, length, dtype=torch.uint8)  # [B, 32, R, 2, L]
    torch.bitwise_or(low_rows & 0x0F, torch.bitwise_left_shift(high_rows, 4), out=pairs[:, :, :, 0])  # 2Lr + i
    torch.bitwise_or(low_rows >> 4, high_rows & 0xF0, out=pairs[:, :, :, 1])  # 2Lr + L + i
    out.view(-1, runs * 2 * length, HALF).copy_(_transposed(pairs.view(-1, HALF, runs * 2 * length)))


def codes_from_packed(packed: torch.Tensor) -> torch.Tensor:
    """The kernel's bytes [N, K / 2] (N a multiple of 64) back as codes [N, K] uint8 in 0…15."""
    rows, width = packed.shape[0], packed.shape[1] * 2
    blocks = packed.view(-1, width, HALF)  # [N / 64, K, 32]: byte (k, j)
    q = torch.empty(rows // CPU_INT4_PACK_ROWS, 2, HALF, width, dtype=torch.uint8)  # [N / 64, 2, 32, K]
    q[:, 0] = (blocks & 0x0F).transpose(1, 2)
    q[:, 1] = (blocks >> 4).transpose(1, 2)
    return q.view(rows, width)


def _transposed(nibbles: torch.Tensor) -> torch.Tensor:
    """[B, 32, K] bytes as [B, K, 32], contiguous: copied in tiles of 32 columns, which keeps both sides' lines
    in cache (faster than a plain transposed copy)."""
    blocks, half, width = nibbles.shape
    tiles = nibbles.view(blocks, half, width // HALF, HALF).permute(0, 2, 3, 1)  # [B, K / 32, 32, 32]
    return tiles.contiguous().view(blocks, width, half)
