"""Weight-only int8 and 4-bit linear layers for the fast path (engine thread).

Which format runs on which kernel, and why, on a GPU (``format_plan`` decides which formats a model uses):

* ``bf16`` / ``fp16``: plain ``F.linear`` (cuBLAS); nothing to unpack.
* ``int8`` (format ``int8``): one int8 per weight with a bf16 scale per output
  row. A single token (every decode step) goes through ``triton_gemv``, which
  reads each weight byte once and scales in registers. Several tokens (prefill)
  dequantize the layer to bf16 and use cuBLAS: that is compute-bound, so the
  extra bytes hardly matter. ``torch._weight_int8pack_mm`` is not used: its CUDA
  kernel (torch 2.9+) takes fp32 activations and gives each thread a whole row,
  far from the bandwidth limit. bitsandbytes int8 is slower still at batch 1 and
  cannot be captured in a CUDA graph.
* ``int4``: four bits per weight, asymmetric per group of 128
  (64 or 32 when the layer's width demands) with a bf16 scale and zero point per
  group, packed for ``torch._weight_int4pack_mm``: PyTorch's tinygemm kernel, the
  one gpt-fast uses, graph-capturable, about 0.53 bytes per weight. (bitsandbytes'
  NF4, a normal-float table, serves the 4-bit precision on a GPU for architectures
  the fast path does not cover; on the CPU they take these formats, through
  ``packed_linear``.)
  A layer the kernel cannot take (rows not a multiple of 8, width not of 32)
  falls back to int8.

On the CPU, ``int4`` runs on ``_weight_int4pack_mm_for_cpu`` with groups of 32:
llama.cpp's block size, so the weights of a 4-bit GGUF file (Q4_0, Q4_1, Q4_K
blocks: ``d * q + m`` per 32 weights) come back exactly, up to the rounding of each
group's scale and zero point: to bf16 for PyTorch's kernel, to int8 codes under a bf16 factor per 8 groups for
Hearth's (``native.int4_scales``). A decode step reads ~0.58 bytes per weight (PyTorch's: ~0.63)
instead of fp16's 2, which is what sets its speed; on the kernel, several tokens at
once (prefill) run much slower than FBGEMM's fp16 kernel, which dequantizes nothing,
so calls of many rows go to ``int4_prompts`` (int8 GEMMs), and fewer rows to Hearth's own kernel
(``native.int4_matmul``) where it is built; where the CPU has AMX, or the kernel's avx512 variant runs (VNNI's
dot products, ``native.int4_matmul.takes_prompts``), that kernel takes calls of many rows as well. The ``int8`` format has no
fast CPU kernel in PyTorch (``_weight_int8pack_mm`` is slower than fp32 here): on the
CPU it runs on Hearth's (``native.int8_matmul``, an fp16 scale per 32 weights), which
holds the output layer beside 4-bit decode copies (``format_plan``), and
elsewhere it only serves tests of the quantizer, through the dequantized form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from engine.forward.native import int4_matmul as native_int4
from engine.forward.native import int8_matmul as native_int8
from engine.forward.weights import int4_prompts, triton_gemv
from engine.forward.weights.cpu_int4_layout import codes_from_packed, packed_from_codes
from engine.forward.weights.int8_groups import Int8Groups
from engine.forward.weights.packed_sizes import INT4_PAIR
from engine.forward.weights.row_chunks import RowChunks

QUANT_FORMATS = ("int8", "int4", INT4_PAIR)
INT4_FORMATS = ("int4", INT4_PAIR)  # formats whose weights stay in their groups: a norm scales the activations
INT4_GROUPS = (128, 64, 32)
INT4_INNER_K_TILES = (8, 4, 2)
CPU_INT4_GROUP = 32
ROWS_AT_ONCE = 4096  # rows quantized from fp32 (or decoded into it) at a time, so a token table needs no full temporary
WEIGHTS_AT_ONCE = 2**20  # weights decoded from GGUF blocks at a time (``rows_at_once``)

Run = Callable[[torch.Tensor], torch.Tensor]
RowChunk = Callable[[int, int, torch.Tensor], torch.Tensor]  # (start, end, codes out) -> scales and zeros


def rows_at_once(width: int) -> int:
    """Rows of ``width`` weights to decode at a time: about ``WEIGHTS_AT_ONCE`` weights. Their temporaries (4 MB
    of fp32) stay under glibc's mmap threshold and in a core's L2; in larger chunks each would come as fresh
    pages from the kernel, which makes decoding a large model's wide layers markedly slower."""
    return max(1, WEIGHTS_AT_ONCE // width)


def pack_quantized(weight: torch.Tensor | Int4Groups | Int4Pair, bias: torch.Tensor | None,
                   fmt: str) -> tuple[Run, int]:
    """``weight`` [N, K] as ``fmt`` ("int8", "int4" or ``INT4_PAIR``); returns ``x [M, K] -> [M, N]`` and the
    bytes held.

    ``Int4Groups`` (or an ``Int4Pair``'s) whose groups the kernel takes are packed as they are; anything else is
    (re)quantized.
    """
    if fmt == INT4_PAIR:
        return _int4_pair_linear(as_int4_pair(weight), bias)
    if isinstance(weight, Int4Pair):
        weight = weight.dequantize()
    if isinstance(weight, Int4Groups):
        layout = _groups_layout(weight) if fmt == "int4" else None
        if layout:
            run, nbytes = _int4_packed(weight, layout[1])
            return _with_bias(run, nbytes, bias, weight.device.type == "cuda")
        weight = weight.dequantize()
    layout = int4_layout(*weight.shape, weight.device) if fmt == "int4" else None
    run, nbytes = _int4_linear(weight, *layout) if layout else _int8_linear(weight)
    return _with_bias(run, nbytes, bias, weight.device.type == "cuda")


def _int4_pair_linear(pair: Int4Pair, bias: torch.Tensor | None) -> tuple[Run, int]:
    """Each plane on the int4 kernel, their products summed; a plane the kernel cannot take sends the whole to
    ``int4`` (which falls back to int8)."""
    layouts = [_groups_layout(plane) for plane in pair.planes]
    if None in layouts:
        return pack_quantized(pair.dequantize(), bias, "int4")
    runs, sizes = zip(*(_int4_packed(plane, tiles) for plane, (_, tiles) in zip(pair.planes, layouts)))
    run = runs[0] if len(runs) == 1 else (lambda x: runs[0](x).add_(runs[1](x)))
    return _with_bias(run, sum(sizes), bias, pair.device.type == "cuda")


def _with_bias(run: Run, nbytes: int, bias: torch.Tensor | None, on_gpu: bool) -> tuple[Run, int]:
    if bias is None:
        return run, nbytes
    bias = bias.to(torch.bfloat16 if on_gpu else torch.float32)
    return (lambda x: run(x) + bias), nbytes + bias.numel() * bias.element_size()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: ``weight`` ≈ ``q * scales[:, None]``; q [N, K] int8, scales [N] bf16."""
    w = weight.float()
    scales = (w.abs().amax(dim=1).clamp(min=1e-8) / 127).to(torch.bfloat16)  # [N]
    q = (w / scales.float().unsqueeze(1)).round().clamp(-127, 127).to(torch.int8)  # [N, K]
    return q, scales


def _int8_linear(weight: torch.Tensor | RowChunks | Int8Groups) -> tuple[Run, int]:
    """On the CPU Hearth's int8 kernel where it takes the shape (groups of 32, ``native.int8_matmul``, ``RowChunks``
    a few rows at a time, ``Int8Groups`` as they are); elsewhere per-row int8, on a GPU with Triton's GEMV for one
    row."""
    if weight.device.type == "cpu" and native_int8.covers(*weight.shape):
        multiply = native_int8.Int8Matmul(weight)
        return multiply, multiply.nbytes
    dense = weight.dequantize() if isinstance(weight, (RowChunks, Int8Groups)) else weight  # [N, K]
    q, scales = quantize_int8(dense)
    use_gemv = dense.is_cuda and triton_gemv.available()

    def run(x: torch.Tensor) -> torch.Tensor:
        if use_gemv and x.shape[0] == 1:
            return triton_gemv.int8_gemv(x, q, scales)  # [1, N]
        return F.linear(x, q.to(x.dtype)) * scales.to(x.dtype)  # [M, N]

    return run, q.numel() + scales.numel() * scales.element_size()


def int4_layout(rows: int, width: int, device: torch.device, group: int | None = None) -> tuple[int, int] | None:
    """(group size, inner k-tiles) the int4 kernel on ``device`` takes for a [rows, width] weight, or None.

    ``group``: the groups the weight already comes in (``Int4Groups``); None picks the largest that fits.
    """
    if device.type == "cpu":
        fits = rows % 16 == 0 and width % CPU_INT4_GROUP == 0 and group in (None, CPU_INT4_GROUP)
        return (CPU_INT4_GROUP, 1) if fits else None  # the CPU kernel ignores the k-tiles
    if rows % 8 or width % 32:
        return None
    group = group or next((g for g in INT4_GROUPS if width % g == 0), None)
    if group is None or width % group:
        return None
    tiles = next(t for t in INT4_INNER_K_TILES if width % (t * 16) == 0)  # width % 32 == 0 holds here
    return group, tiles


def _groups_layout(weight: Int4Groups) -> tuple[int, int] | None:
    return int4_layout(*weight.shape, weight.device, weight.group)


def quantize_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group: ``w ≈ (q - 8) * scale + zero``.

    Returns q [N, K] int32 in 0…15 and scales-and-zeros [K / group, N, 2] bf16 (the kernels' layout).
    """
    rows, width = weight.shape
    grouped = weight.float().reshape(rows, width // group, group)  # [N, G, group]
    scales, zeros, lowest = int4_group_params(grouped.amin(dim=-1), grouped.amax(dim=-1))
    q = int4_codes(grouped - lowest.unsqueeze(-1), scales).to(torch.int32)  # one temporary
    return q.reshape(rows, width), scales_and_zeros_of(scales, zeros)


def int4_group_params(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each group's bf16 scale and zero point from its lowest and highest weight (fp32 [N, G] each), and the
    fp32 value q = 0 stands for, [N, G]."""
    scales = ((high - low).clamp(min=1e-6) / 15).to(torch.bfloat16)
    zeros = (low + scales.float() * 8).to(torch.bfloat16)
    return scales, zeros, zeros.float() - scales.float() * 8


def int4_codes(above_lowest: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Weights minus their group's lowest value [N, G, group] fp32 (overwritten) as codes 0…15, still fp32."""
    return above_lowest.div_(scales.float().unsqueeze(-1)).round_().clamp_(0, 15)


def scales_and_zeros_of(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """bf16 scales and zero points [N, G] each in the kernels' layout, [G, N, 2]."""
    return torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()


def dequantize_int4(q: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The fp32 weight [N, K] that ``quantize_int4``'s output stands for (an fp16 copy's source, tests, checks)."""
    rows, width = q.shape
    scales, zeros = scales_and_zeros.float().transpose(0, 1).unsqueeze(-1).unbind(-2)  # [N, G, 1] each
    grouped = q.reshape(rows, width // group, group).float()  # [N, G, group]: the one full-size buffer
    grouped.sub_(8).mul_(scales.contiguous()).add_(zeros.contiguous())
    return grouped.reshape(rows, width)


def int4_groups_of(weight: torch.Tensor, group: int = CPU_INT4_GROUP) -> Int4Groups:
    """``weight`` [N, K] quantized into groups of ``group`` (``quantize_int4``), ``ROWS_AT_ONCE`` rows at a time so
    that a large token table or output layer needs no full-size temporaries."""

    def quantized(start: int, end: int, out: torch.Tensor) -> torch.Tensor:
        q, scales_and_zeros = quantize_int4(weight[start:end], group)
        out.copy_(q)
        return scales_and_zeros

    return Int4Groups.from_row_chunks(*weight.shape, quantized, group=group, device=weight.device)


def _int4_linear(weight: torch.Tensor, group: int, tiles: int) -> tuple[Run, int]:
    return _int4_packed(int4_groups_of(weight, group), tiles)  # the same groups as at once: each row's are its own


def _int4_packed(groups: Int4Groups, tiles: int) -> tuple[Run, int]:
    """The groups packed for the device's int4 kernel: with bf16 scales-and-zeros [K / group, N, 2] for PyTorch's,
    with its own (``int4_scales``) for Hearth's CPU kernel."""
    group, on_gpu = groups.group, groups.device.type == "cuda"
    if not on_gpu and native_int4.covers(*groups.shape, group):
        packed = groups.cpu_packed(tiles)
        native = native_int4.Int4Matmul(packed, groups.scales_and_zeros, group)
        if native.takes_prompts:
            return native, native.nbytes
        return _beside_prompt_path(native, packed, native.scales_and_zeros, int4_prompts.covers(packed.shape[0]),
                                   group), native.nbytes
    scales_and_zeros = groups.scales_and_zeros.to(torch.bfloat16).contiguous()
    if on_gpu:
        q = groups.q.to(torch.uint8)
        nibbles = q[:, ::2] << 4 | q[:, 1::2]  # [N, K/2]: even columns in the high nibble
        packed = torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), tiles)
        matmul = torch.ops.aten._weight_int4pack_mm
    else:
        packed, matmul = groups.cpu_packed(tiles), torch.ops.aten._weight_int4pack_mm_for_cpu
    nbytes = packed.numel() * packed.element_size() + scales_and_zeros.numel() * scales_and_zeros.element_size()
    prompt_path = not on_gpu and int4_prompts.covers(packed.shape[0])

    def few_rows(x: torch.Tensor) -> torch.Tensor:
        activations = x.to(torch.bfloat16).contiguous()  # the kernels take bf16 rows; a no-op on the GPU path
        return matmul(activations, packed, group, scales_and_zeros).to(x.dtype)  # [M, N]

    return _beside_prompt_path(few_rows, packed, lambda start, end: scales_and_zeros[:, start:end], prompt_path,
                               group), nbytes


def _beside_prompt_path(few_rows: Run, packed: torch.Tensor, scales_of_rows: int4_prompts.ScalesOfRows,
                        prompt_path: bool, group: int) -> Run:
    """``few_rows`` for calls of fewer rows than ``int4_prompts`` takes, that path (where the layer has it) for more."""
    def run(x: torch.Tensor) -> torch.Tensor:
        if prompt_path and int4_prompts.takes(x.shape[0]):
            return int4_prompts.prompt_matmul(x, packed, scales_of_rows, group)  # [M, N]
        return few_rows(x)  # [M, N]

    return run


@dataclass(frozen=True)
class Int4Groups:
    """A weight [N, K] already in 4-bit groups, as GGUF's 4-bit blocks come: ``w = (q - 8) * scale + zero``.

    ``codes``: q [N, K] uint8 in 0…15, or with ``in_cpu_layout`` already the CPU kernel's bytes [N, K / 2]
    (``cpu_int4_layout``: made straight from a file's nibbles, N a multiple of 64); ``q`` gives the codes either
    way. ``scales_and_zeros`` [K / group, N, 2], kept in fp32 until packed (bf16 then), so that a row scale folded
    in rounds once. Reordering, concatenating and scaling rows keep the groups intact.
    """

    codes: torch.Tensor
    scales_and_zeros: torch.Tensor
    group: int
    in_cpu_layout: bool = False

    @property
    def q(self) -> torch.Tensor:
        """The codes [N, K] uint8 in 0…15 (unpacked anew where they are kept in the CPU kernel's layout)."""
        return codes_from_packed(self.codes) if self.in_cpu_layout else self.codes

    def cpu_packed(self, tiles: int) -> torch.Tensor:
        """The CPU kernel's bytes [N, K / 2]."""
        return self.codes if self.in_cpu_layout else packed_from_codes(self.codes, tiles)

    @property
    def shape(self) -> torch.Size:
        groups, rows, _ = self.scales_and_zeros.shape
        return torch.Size((rows, groups * self.group))

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device: torch.device) -> Int4Groups:
        scales_and_zeros = self.scales_and_zeros.to(device, torch.float32)
        if self.in_cpu_layout and device.type == "cpu":
            return Int4Groups(self.codes, scales_and_zeros, self.group, in_cpu_layout=True)
        return Int4Groups(self.q.to(device), scales_and_zeros, self.group)

    def rows(self, order: torch.Tensor) -> Int4Groups:
        """The rows ``order`` [N'] in that order."""
        return Int4Groups(self.q[order], self.scales_and_zeros[:, order], self.group)

    def scaled(self, factor: float) -> Int4Groups:
        """Every weight times ``factor``: each group's scale and zero point are."""
        return Int4Groups(self.codes, self.scales_and_zeros.float() * factor, self.group, self.in_cpu_layout)

    def scale_rows_(self, end: int, factor: float) -> None:
        """Rows 0…``end``'s weights times ``factor``, in place: their groups' scales and zero points, as ``scaled``
        rounds them."""
        self.scales_and_zeros[:, :end].mul_(factor)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.q, self.scales_and_zeros, self.group)  # [N, K] fp32

    @staticmethod
    def from_row_chunks(
        rows: int, width: int, decode: RowChunk, rows_at_once: int | None = None, group: int = CPU_INT4_GROUP,
        device: torch.device | None = None,
    ) -> Int4Groups:
        """``rows`` rows of ``width`` weights in groups of ``group``, made ``rows_at_once`` (default
        ``ROWS_AT_ONCE``) at a time by ``decode(start, end, q)``: it writes rows start…end's codes into ``q``
        [end - start, width] uint8, a view of the result, and returns their scales and zeros [G, end - start, 2]."""
        step = rows_at_once or ROWS_AT_ONCE
        q = torch.empty(rows, width, dtype=torch.uint8, device=device)  # [N, K]
        scales_and_zeros = torch.empty(width // group, rows, 2, device=device)  # [G, N, 2]
        for start in range(0, rows, step):
            end = min(rows, start + step)
            scales_and_zeros[:, start:end] = decode(start, end, q[start:end])
        return Int4Groups(q, scales_and_zeros, group)

    @staticmethod
    def cat(parts: Sequence[Int4Groups]) -> Int4Groups:
        """The parts' rows one after another (all of one group size), in the CPU kernel's layout where all are."""
        in_cpu_layout = all(part.in_cpu_layout for part in parts)
        return Int4Groups(
            torch.cat([part.codes if in_cpu_layout else part.q for part in parts]),
            torch.cat([part.scales_and_zeros.float() for part in parts], dim=1), parts[0].group, in_cpu_layout,
        )


@dataclass(frozen=True)
class Int4Pair:
    """A weight [N, K] as two planes of 4-bit groups, ``w ≈ coarse + fine`` (``INT4_PAIR``): ``fine`` holds the
    groups of what ``coarse``'s rounding left, a fifteenth of its step (None where ``coarse`` is exact: a
    4-bit source's own groups)."""

    coarse: Int4Groups
    fine: Int4Groups | None

    @property
    def shape(self) -> torch.Size:
        return self.coarse.shape

    @property
    def device(self) -> torch.device:
        return self.coarse.device

    @property
    def planes(self) -> tuple[Int4Groups, ...]:
        return (self.coarse,) if self.fine is None else (self.coarse, self.fine)

    def to(self, device: torch.device) -> Int4Pair:
        return Int4Pair(self.coarse.to(device), self.fine.to(device) if self.fine is not None else None)

    def dequantize(self) -> torch.Tensor:
        weight = self.coarse.dequantize()  # [N, K] fp32
        return weight if self.fine is None else weight.add_(self.fine.dequantize())

    @staticmethod
    def from_rows(rows: int, width: int, dense: Callable[[int, int], torch.Tensor], group: int = CPU_INT4_GROUP,
                  device: torch.device | None = None) -> Int4Pair:
        """The pair of a weight whose rows start…end ``dense(start, end)`` gives in fp32 [end - start, K],
        ``rows_at_once`` rows at a time: no full-size fp32 copy, and temporaries that stay in cache (a large
        model's output layer is split into two planes much faster this way than in chunks of thousands of rows)."""
        planes = [(torch.empty(rows, width, dtype=torch.uint8, device=device),
                   torch.empty(width // group, rows, 2, device=device)) for _ in range(2)]  # q [N, K], [G, N, 2]
        step = rows_at_once(width)
        for start in range(0, rows, step):
            end = min(rows, start + step)
            rest = dense(start, end).float()  # [n, K]
            for q, scales_and_zeros in planes:
                codes, scales_and_zeros[:, start:end] = quantize_int4(rest, group)
                q[start:end] = codes
                rest = rest - dequantize_int4(codes, scales_and_zeros[:, start:end], group)  # what is left
        (coarse_q, coarse_sz), (fine_q, fine_sz) = planes
        return Int4Pair(Int4Groups(coarse_q, coarse_sz, group), Int4Groups(fine_q, fine_sz, group))


def as_int4_pair(weight: torch.Tensor | Int4Groups | Int4Pair) -> Int4Pair:
    """``weight`` as an ``Int4Pair``: 4-bit groups as they are (exact, one plane), fp32 quantized into two."""
    if isinstance(weight, Int4Pair):
        return weight
    if isinstance(weight, Int4Groups):
        return Int4Pair(weight, None)
    return Int4Pair.from_rows(*weight.shape, lambda start, end: weight[start:end], device=weight.device)
