"""A GGUF file's quantized blocks into the fast path's weight formats at load, in C (engine thread; OpenMP threads
inside each call).

``gguf_layout.c`` decodes Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K rows at memory speed, straight from the bytes
read from the file, into: their fp32 weights (``dense_rows``, gguf-py's floats bit for bit), int4 groups of 32
(``int4_groups``: a 4-bit type's own nibbles and scales, any other's weights requantized as
``quant_int.int4_groups_of`` does), in the CPU int4 kernel's layout where asked, or two planes of them
(``int4_pair``, as ``quant_int.Int4Pair.from_rows`` makes them); and fp32 rows into the int8
kernel's layout (``int8_layout``, as ``int8_matmul.quantize`` rounds them), or a Q8_0 file's codes and scales as
they are (``int8_layout_from_codes``). It is portable C that any x86-64 CPU
runs (``build.layout_library``); where it could not be built (no compiler) ``available()`` is False and the
callers keep their PyTorch ops, which give the same bytes.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.forward.native.build import address, layout_library
from engine.forward.weights.packed_sizes import CPU_INT4_PACK_ROWS, INT8_BLOCK_ROWS, INT8_GROUP

TYPES = tuple(GGMLQuantizationType[name] for name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"))
GROUP = 32  # weights an int4 group holds
MAX_WIDTH = 65536  # the widest row handed to the C functions; wider rows keep the PyTorch ops


def available() -> bool:
    """Whether the C functions are built and loaded here."""
    return layout_library() is not None


def takes(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> bool:
    """Whether rows of blocks [N, bytes per row] (each row's bytes contiguous) decode here."""
    return (available() and quant_type in TYPES and blocks.ndim == 2 and blocks.strides[1] == 1
            and _width(blocks, quant_type) <= MAX_WIDTH)


def dense_rows(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> torch.Tensor:
    """Rows of blocks [N, bytes per row] (``takes``) as their fp32 weights [N, K], equal to gguf-py's."""
    rows, width = blocks.shape[0], _width(blocks, quant_type)
    out = torch.empty(rows, width)  # [N, K]
    layout_library().gguf_dense_rows(_pointer(blocks), rows, blocks.strides[0], int(quant_type), width, out.data_ptr())
    return out


def int4_groups(blocks: np.ndarray, quant_type: GGMLQuantizationType,
                in_layout: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of blocks [N, bytes per row] (``takes``) as int4 groups of 32, ``w = (q - 8) * scale + zero``: codes
    [N, K] uint8, or with ``in_layout`` (N a multiple of 64) the CPU int4 kernel's bytes [N, K / 2]; and scales and
    zeros [K / 32, N, 2] fp32 (bf16 numbers where requantized)."""
    rows, width = blocks.shape[0], _width(blocks, quant_type)
    codes = torch.empty(rows, width // 2 if in_layout else width, dtype=torch.uint8)
    scales_and_zeros = torch.empty(width // GROUP, rows, 2)  # [G, N, 2]
    int4_groups_into(blocks, quant_type, in_layout, codes, scales_and_zeros)
    return codes, scales_and_zeros


def int4_groups_into(blocks: np.ndarray, quant_type: GGMLQuantizationType, in_layout: bool, codes: torch.Tensor,
                     scales_and_zeros: torch.Tensor) -> None:
    """``int4_groups`` written into ``codes`` (contiguous) and ``scales_and_zeros`` [K / 32, N, 2] fp32 (pairs
    contiguous): rows of a larger weight, where several tensors' rows go one after another."""
    rows, width = blocks.shape[0], _width(blocks, quant_type)
    if in_layout and rows % CPU_INT4_PACK_ROWS:
        raise ValueError(f"the int4 layout takes whole blocks of {CPU_INT4_PACK_ROWS} rows, not {rows}")
    if (codes.shape != (rows, width // 2 if in_layout else width) or not codes.is_contiguous()
            or codes.dtype != torch.uint8 or scales_and_zeros.dtype != torch.float32
            or scales_and_zeros.shape != (width // GROUP, rows, 2) or scales_and_zeros.stride()[1:] != (2, 1)):
        raise ValueError("the codes or scales given do not fit these rows")
    layout_library().gguf_int4_groups(_pointer(blocks), rows, blocks.strides[0], int(quant_type), width,
                                      int(in_layout), codes.data_ptr(), scales_and_zeros.data_ptr(),
                                      scales_and_zeros.stride(0))


def int4_pair(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Rows of blocks [N, bytes per row] (``takes``) as two planes of int4 groups of 32, as ``Int4Pair.from_rows``
    makes them: the coarse plane's and then the fine plane's codes [N, K] uint8 and scales and zeros
    [K / 32, N, 2] fp32."""
    rows, width = blocks.shape[0], _width(blocks, quant_type)
    planes = tuple((torch.empty(rows, width, dtype=torch.uint8), torch.empty(width // GROUP, rows, 2))
                   for _ in range(2))
    (coarse, coarse_pairs), (fine, fine_pairs) = planes
    layout_library().gguf_int4_pair(_pointer(blocks), rows, blocks.strides[0], int(quant_type), width,
                                    coarse.data_ptr(), coarse_pairs.data_ptr(), fine.data_ptr(), fine_pairs.data_ptr())
    return planes


def int8_layout(weight: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> None:
    """fp32 rows [n, K] (whole blocks of 64, whole groups of 32) into the int8 kernel's ``packed``
    [n / 64, K / 4, 4, 16, 4] uint8 and ``scales`` [n / 64, K / 32, 64] fp16 (views of its buffers, contiguous)."""
    rows, width = weight.shape
    if rows % INT8_BLOCK_ROWS or width % INT8_GROUP:
        raise ValueError(f"the int8 layout takes whole blocks of {INT8_BLOCK_ROWS} rows and groups of {INT8_GROUP}")
    weight = weight.float().contiguous()
    layout_library().int8_layout_from_rows(weight.data_ptr(), rows, width, address(packed), address(scales))


def int8_layout_from_codes(codes: torch.Tensor, group_scales: torch.Tensor, packed: torch.Tensor,
                           scales: torch.Tensor) -> None:
    """int8 codes [n, K] and their groups' fp32 scales [n, K / 32] (``Int8Groups``, contiguous) into the int8
    kernel's ``packed`` and ``scales`` (as ``int8_layout``) as they are, each scale rounded to fp16."""
    rows, width = codes.shape
    if rows % INT8_BLOCK_ROWS or width % INT8_GROUP or group_scales.shape != (rows, width // INT8_GROUP):
        raise ValueError(f"the int8 layout takes whole blocks of {INT8_BLOCK_ROWS} rows and groups of {INT8_GROUP}")
    codes, group_scales = codes.contiguous(), group_scales.float().contiguous()
    layout_library().int8_layout_from_codes(codes.data_ptr(), group_scales.data_ptr(), rows, width, address(packed),
                                            address(scales))


def _width(blocks: np.ndarray, quant_type: GGMLQuantizationType) -> int:
    block_size, type_size = GGML_QUANT_SIZES[quant_type]
    return blocks.shape[1] // type_size * block_size


def _pointer(blocks: np.ndarray) -> int:
    return blocks.ctypes.data
