"""Linear layers and embedding tables in the weight formats of the fast path (engine thread).

At batch size 1 a decode step reads every weight once, so the bytes per weight
set the speed. On the CPU, ``fp16`` uses FBGEMM's prepacked half-precision
kernel, which PyTorch ships: weights in half precision, products and sums in
fp32, so results stay within rounding of fp32 at half the bytes (it packs each
row in blocks of 512 columns, the last padded with zeros, ``packed_sizes``). A
copy that only prompts use, beside a copy for few rows, keeps a short last block
apart in fp32 instead where it has many rows (``packed_sizes.TAIL_APART_ROWS``):
less memory, at no cost a prompt chunk notices; a copy that decode steps read
stays padded, where the extra call would slow every step. A large prompt-only
copy runs on oneDNN's fp16 matmul instead where the CPU multiplies in fp16
(``packed_sizes.ONEDNN_FP16_WEIGHTS``, ``cpu_features``). (FBGEMM's int8
kernel quantizes activations too and has a fixed cost per call whatever the size,
which makes it slower than fp32 for a small model, so it is not used.) Elsewhere
``fp32``/``bf16``/``fp16`` are plain matmuls in that dtype, and ``int8``/``int4``
are weight-only quantized (``quant_int``; on the CPU only ``int4`` has a fast
kernel). A layer may keep a second copy for few rows (``one_row_fmt``): fp16
for prompts and int4 for decode steps on the CPU.

An RMSNorm's weight scales the columns of the matmul after it. Every format but
the 4-bit ones and the CPU's int8 folds it into the weight; those scale the
activations instead, since folding would break a source's blocks (a 4-bit one holds
16 evenly spaced values, a Q8_0 one 255) and make the groups come back inexactly.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from engine.forward.backend import PREFILL_CHUNK
from engine.forward.native.build import kernels_variant
from engine.forward.native.int8_matmul import Int8Matmul
from engine.forward.weights.int8_groups import Int8Groups
from engine.forward.weights.mxfp4 import Mxfp4Matmul, Mxfp4Rows, mxfp4_linear
from engine.forward.weights.pack_worker import Packed, PackWorker
from engine.forward.weights.packed_sizes import fp16_packed_bytes, fp16_tail_width, runs_on_onednn
from engine.forward.weights.quant_int import (
    INT4_FORMATS, QUANT_FORMATS, Int4Groups, Int4Pair, as_int4_pair, pack_quantized,
)
from engine.host.cpu_features import has_fp16_math

PLAIN_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OVERFLOW_SCALE = 2.0**-8
FEW_ROWS = 16
"""Calls of up to this many rows (a decode step of up to 16 sequences) use the ``one_row_fmt`` copy: at a few rows
the 4-bit copy reads about a quarter of fp16's bytes, and whole decode steps run faster on it at these row counts
(a prompt chunk of a few dozen rows beside decode rows is faster in fp16)."""
FEW_ROWS_NATIVE = 64
"""``FEW_ROWS`` where Hearth's avx512 int4 kernel runs the 4-bit copy (``native.int4_matmul``): with it whole decode
steps run faster on the 4-bit copy than on fp16 at these row counts. The avx2 kernel's dot products cost about three
times as much (no VNNI), so there a 48-row prompt chunk took twice as long on it as in fp16: it keeps ``FEW_ROWS``."""


def few_rows() -> int:
    """The most rows a call answers from a ``Linear``'s ``one_row_fmt`` copy."""
    return FEW_ROWS_NATIVE if kernels_variant("cpu") == "avx512" else FEW_ROWS


class Linear:
    """``y = (x * input_scale) @ W.T + b`` with ``W`` [N, K] held in ``fmt``; ``nbytes`` is what the weights occupy.

    ``input_scale`` [K] is an RMSNorm's weight (see the module docstring). ``one_row_fmt``
    keeps a second copy for calls of up to ``FEW_ROWS`` rows (``FEW_ROWS_NATIVE`` beside Hearth's kernels: decode
    steps, and the short prompt chunks beside them) in that format. ``weight`` may come
    as ``Int4Groups`` (a GGUF file's 4-bit blocks): ``int4`` packs them as they are; or as an ``Int4Pair``,
    which ``int4x2`` packs as it is; or as ``Int8Groups`` (a file's Q8_0 blocks), which ``int8`` packs as they
    are; or as ``Mxfp4Rows`` (gpt-oss's experts), kept so whatever ``fmt``. With a ``worker``, FBGEMM's fp16
    prepack runs on it (``pack_worker``): the layer is ready to call once the worker's block is left. An fp16 copy
    for prompts beside a 4-bit copy of 4-bit groups is packed by the first call that needs it instead
    (``_on_first_call``).
    """

    def __init__(
        self, weight: torch.Tensor | Int4Groups | Int4Pair | Int8Groups | Mxfp4Rows, bias: torch.Tensor | None,
        fmt: str, input_scale: torch.Tensor | None = None, one_row_fmt: str | None = None,
        worker: PackWorker | None = None,
    ) -> None:
        self.fmt = fmt
        self.compute_dtype = compute_dtype(weight.device, fmt)
        if isinstance(weight, Mxfp4Rows):  # one call over the blocks serves every row count: no second copy
            one_row_fmt = None
        if one_row_fmt is not None and _packs_on_first_call(weight, fmt):
            many_rows, self.nbytes = _on_first_call(weight, bias, fmt, input_scale)
        else:
            many_rows, self.nbytes = _scaled_pack(weight, bias, fmt, self.compute_dtype, input_scale,
                                                  prompts_only=one_row_fmt is not None, worker=worker)
        self._run, self.one_row_nbytes = many_rows, self.nbytes  # one_row_nbytes: what a one-row call reads
        # the int8 codes on Hearth's kernel, whose rows a tied token table looks up (``OutputRows``)
        self.int8 = _int8_matmul(many_rows)
        # the call over MXFP4 blocks kept as they are, which a mixture's grouped call makes for all its experts
        self.mxfp4 = many_rows if isinstance(many_rows, Mxfp4Matmul) else None
        if one_row_fmt is not None:
            one_row, self.one_row_nbytes = _scaled_pack(weight, bias, one_row_fmt, self.compute_dtype, input_scale,
                                                        worker=worker)
            self.nbytes += self.one_row_nbytes
            few = few_rows()
            self._run = lambda x: one_row(x) if x.shape[0] <= few else many_rows(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)  # [..., K] -> [..., N]


def _packs_on_first_call(weight: torch.Tensor | Int4Groups | Int4Pair, fmt: str) -> bool:
    """Whether a prompt-only copy is packed when a call first needs it rather than at load: an fp16 copy of a CPU
    weight that comes as 4-bit groups (a GGUF file's), which the layer's 4-bit copy holds anyway."""
    return isinstance(weight, Int4Groups) and fmt == "fp16" and weight.device.type == "cpu"


def _on_first_call(weight: Int4Groups, bias: torch.Tensor | None, fmt: str,
                   input_scale: torch.Tensor | None) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """The prompt-only copy of ``weight`` in ``fmt``, packed by the first call that needs it (the engine thread) and
    kept: dequantizing and packing every layer was most of a small model's load, and a chat whose prompts stay
    within ``few_rows()`` never needs it. The bytes are those it will hold once packed."""
    pending: list[tuple] = [(weight, bias, input_scale)]  # emptied once packed: the groups' fp32 scales go then
    packed: list[Callable[[torch.Tensor], torch.Tensor]] = []

    def run(x: torch.Tensor) -> torch.Tensor:
        if not packed:
            groups, with_bias, scale = pending.pop()
            packed.append(_scaled_pack(groups, with_bias, fmt, torch.float32, scale, prompts_only=True)[0])
        return packed[0](x)

    return run, fp16_packed_bytes(*weight.shape, prompts_only=True, fp16_math=has_fp16_math())


def _scaled_pack(
    weight: torch.Tensor | Int4Groups | Int4Pair | Int8Groups | Mxfp4Rows, bias: torch.Tensor | None, fmt: str,
    dtype: torch.dtype, input_scale: torch.Tensor | None, prompts_only: bool = False, worker: PackWorker | None = None,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """``_pack`` with ``input_scale`` folded into the weight, or (4-bit groups, the CPU's int8 groups) applied to
    the input on each call."""
    if isinstance(weight, Mxfp4Rows):  # gpt-oss's experts stay in their blocks, whatever the format
        return mxfp4_linear(weight, bias, input_scale, exact=fmt == "fp32")
    if (isinstance(weight, (Int4Groups, Int4Pair)) and fmt not in INT4_FORMATS
            or isinstance(weight, Int8Groups) and fmt != "int8"):
        weight = weight.dequantize()  # [N, K] fp32
    if input_scale is None or not _scales_activations(fmt, weight.device):
        folded = weight if input_scale is None else weight * input_scale  # [N, K] * [K]
        return _pack(folded, bias, fmt, dtype, prompts_only, worker)
    run, nbytes = _pack(weight, bias, fmt, dtype)
    return InputScaled(run, input_scale.to(dtype)), nbytes  # in the activations' dtype (bf16 on a GPU)


class InputScaled:
    """``run`` on its input times ``scale`` [K] (a norm's weight that the weight's groups do not fold in)."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], scale: torch.Tensor) -> None:
        self.run, self._scale = run, scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x * self._scale)


def _int8_matmul(run: Callable[[torch.Tensor], torch.Tensor]) -> Int8Matmul | None:
    """The ``Int8Matmul`` that ``run`` multiplies on, input scale or not; None for any other format."""
    inner = run.run if isinstance(run, InputScaled) else run
    return inner if isinstance(inner, Int8Matmul) else None


def _scales_activations(fmt: str, device: torch.device) -> bool:
    """Whether a norm's weight scales the input of a matmul in ``fmt`` rather than folding into it: the formats whose
    groups stay as the source has them (a GGUF file's 4-bit blocks, a Q8_0 table's blocks on the CPU)."""
    return fmt in INT4_FORMATS or (fmt == "int8" and device.type == "cpu")


def compute_dtype(device: torch.device, fmt: str) -> torch.dtype:
    """A ``Linear``'s activations' dtype, as ``format_plan.fast_formats`` plans a model's ``compute``: fp32 on the
    CPU (FBGEMM takes fp32 activations whatever the weight format), else ``fmt``'s or bf16 (quantized formats)."""
    if device.type == "cpu":
        return torch.float32
    return PLAIN_DTYPES.get(fmt, torch.bfloat16)


def _pack(
    weight: torch.Tensor | Int4Groups | Int4Pair, bias: torch.Tensor | None, fmt: str, dtype: torch.dtype,
    prompts_only: bool = False, worker: PackWorker | None = None,
) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """``prompts_only``: a copy that only prompts use, so an fp16 weight may run on oneDNN or keep its short last
    block of columns in fp32 (the module docstring)."""
    if fmt in QUANT_FORMATS:
        return pack_quantized(weight, bias, fmt)
    if weight.device.type == "cpu" and fmt == "fp16":
        if runs_on_onednn(*weight.shape, prompts_only, has_fp16_math()):
            return _onednn_fp16(weight, bias)
        return _fbgemm_fp16(weight.float(), _fp32(bias), prompts_only, worker)
    if fmt not in PLAIN_DTYPES:
        raise ValueError(f"Weight format {fmt!r} is not supported on {weight.device.type}.")
    weight = weight.to(dtype).contiguous()
    bias = bias.to(dtype) if bias is not None else None
    return (lambda x: F.linear(x, weight, bias)), weight.numel() * weight.element_size()


def _fbgemm_fp16(weight: torch.Tensor, bias: torch.Tensor | None, prompts_only: bool,
                 worker: PackWorker | None) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """FBGEMM's prepacked fp16 matmul of ``weight`` [N, K], packed on ``worker`` where there is one; with
    ``prompts_only`` a short last block of columns (``fp16_tail_width``) goes to an fp32 matmul added to its result
    instead of to zeros padding it to a whole block."""
    rows, width = weight.shape
    nbytes = fp16_packed_bytes(rows, width, prompts_only, fp16_math=False)
    tail = fp16_tail_width(rows, width) if prompts_only else 0
    whole = width - tail
    packed = _prepacked_fp16(weight[:, :whole].contiguous() if tail else weight, bias, worker)
    if tail == 0:
        return (lambda x: torch.ops.quantized.linear_dynamic_fp16(x, packed.value)), nbytes
    tail_columns = weight[:, whole:].t().contiguous()  # [tail, N]

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x[:, :whole], packed.value).addmm_(x[:, whole:], tail_columns)

    return run, nbytes


def _prepacked_fp16(weight: torch.Tensor, bias: torch.Tensor | None, worker: PackWorker | None) -> Packed:
    """FBGEMM's fp16 packing of ``weight`` [N, K], on ``worker`` where there is one, else at once."""
    if worker is not None:
        return worker.pack(torch.ops.quantized.linear_prepack_fp16, weight, bias)
    packed = Packed()
    packed.value = torch.ops.quantized.linear_prepack_fp16(weight, bias)
    return packed


def _onednn_fp16(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """oneDNN's fp16 matmul of ``weight`` [N, K], prepacked (``packed_sizes.ONEDNN_FP16_WEIGHTS``): fp16 rows in,
    fp32 sums, fp16 out. A result past fp16's range (65 504) is computed again from rows scaled down by 2^8."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.half(), PREFILL_CHUNK)  # laid out for a prompt chunk
    bias16 = bias.half() if bias is not None else None

    def matmul(x: torch.Tensor, with_bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.half(), packed, with_bias, "none", [], "")  # [M, N] fp16

    def run(x: torch.Tensor) -> torch.Tensor:
        out = matmul(x, bias16).float()  # [M, N]
        if torch.isfinite(out.sum()):  # one pass over the result: an inf (or a nan from inf - inf) shows in the sum
            return out
        scaled = matmul(x * OVERFLOW_SCALE, None).float().div_(OVERFLOW_SCALE)  # [M, N]
        return scaled if bias is None else scaled.add_(bias)

    return run, fp16_packed_bytes(*weight.shape, prompts_only=True, fp16_math=True)


def _fp32(bias: torch.Tensor | None) -> torch.Tensor | None:
    return bias.float().contiguous() if bias is not None else None


def embedding(
    table: torch.Tensor | Int4Groups | Int4Pair, storage: torch.dtype | None, dtype: torch.dtype
) -> Embedding | Int4Embedding:
    """The token table kept in ``storage``, or (None) in planes of 4-bit groups (``Int4Pair``) as
    ``Int4Embedding``."""
    if storage is None:
        return Int4Embedding(as_int4_pair(table).planes, dtype)
    return Embedding(table.dequantize() if isinstance(table, (Int4Groups, Int4Pair)) else table, storage, dtype)


class Int4Embedding:
    """Token id → hidden vector from a table in planes of 4-bit groups (``Int4Pair``), summed: two codes a byte,
    a bf16 scale and zero per group."""

    def __init__(self, planes: tuple[Int4Groups, ...], dtype: torch.dtype) -> None:
        self.dtype, self._group = dtype, planes[0].group
        self._planes = [self._packed(plane) for plane in planes]
        self.nbytes = sum(nibbles.numel() + scales_and_zeros.numel() * 2 for nibbles, scales_and_zeros in self._planes)

    @staticmethod
    def _packed(plane: Int4Groups) -> tuple[torch.Tensor, torch.Tensor]:
        q = plane.q.to(torch.uint8)
        nibbles = q[:, ::2] | q[:, 1::2] << 4  # [V, D/2]: even columns in the low nibble
        return nibbles, plane.scales_and_zeros.transpose(0, 1).to(torch.bfloat16).contiguous()  # [V, G, 2]

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        rows = sum(self._rows(*plane, token_ids) for plane in self._planes)  # [S, G, group]
        return rows.flatten(1).to(self.dtype)  # [S, D]

    def _rows(self, nibbles: torch.Tensor, scales_and_zeros: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        packed = nibbles[token_ids]  # [S, D/2]
        q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(1)  # [S, D]
        scales, zeros = scales_and_zeros[token_ids].float().unsqueeze(-1).unbind(-2)  # [S, G, 1] each
        return (q.unflatten(1, (-1, self._group)).float() - 8) * scales + zeros  # [S, G, group]


class OutputRows:
    """Token id → hidden vector, where the table is tied to the output layer and that is int8 on Hearth's kernel:
    its codes' rows (``Int8Matmul.rows``), so the table is not held twice. ``nbytes`` 0: the output layer counts
    them."""

    nbytes = 0

    def __init__(self, weights: Int8Matmul, dtype: torch.dtype) -> None:
        self._weights, self.dtype = weights, dtype

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._weights.rows(token_ids).to(self.dtype)  # [S, D]


class Embedding:
    """Token id → hidden vector, from a table kept in ``storage`` (rows are converted to ``dtype`` on lookup)."""

    def __init__(self, table: torch.Tensor, storage: torch.dtype, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._table = table.to(storage)  # [V, D]
        self.nbytes = self._table.numel() * self._table.element_size()

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self._table).to(self.dtype)  # [S, D]
