"""A batched step's attention in the CPU kernels, read in place from the block pool (engine thread).

A decode row is one query token over its sequence's keys and values, which lie in one
or two runs of the pool's position axis. In PyTorch ops that is two small ``bmm`` and a
softmax per row and layer, each call costing more in dispatch and thread wake-up than
in arithmetic. ``DecodeRuns`` turns the step's decode rows and runs into index tensors
once; its ``attend`` runs all of them and every kv head of one layer in one call, the
softmax's running maximum kept per query head (one pass over the positions).
``ChunkRuns`` does the same for a short prompt chunk (the tokens a step takes beside
decoding rows), each row seeing the positions up to its own (the last ``window`` of them
in a window layer), where it is faster than SDPA. A decode row's runs already hold
just the positions it sees. Where a model's prompts already run in bf16 on AMX's tiles
(``FormatPlan.prompt_attention``), a chunk runs on them too (``on_tiles``): queries
and weights rounded to bf16, sums in fp32.

The pool holds bf16 (``FormatPlan.kv_cache``); the kernels read it as it is, each key
and value widened exactly to fp32, and every sum runs in fp32. An int8 pool (``kv_layout``:
each row's codes, then an fp16 scale per 32) is read by the ``_q8`` functions, which
dequantize each row as they read it (code × scale in fp32) and sum in fp32 likewise, where
the variant has them (``reads_int8``). A chunk over an int8 pool never runs on AMX's tiles:
the fp32 kernel reads the codes directly, where the tiles would need each row rounded to
bf16 a second time (a code times an fp16 scale holds up to 19 significant bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from engine.forward.kv_layout import KV_GROUP
from engine.forward.native.build import LANES, address, library
from engine.forward.paged_kv import INT8_ROWS

MAX_GROUPS, MAX_HEAD_DIM = 16, 256  # the kernel's per-task arrays (``kernels.c``)
TILE_DIMS, MAX_TILE_HEAD_DIM = 32, 128  # the tile kernel's head dimensions: whole tile rows, at most its arrays'


def tiles_cover(head_dim: int) -> bool:
    """Whether a chunk of heads of ``head_dim`` may attend on AMX's tiles (``ChunkRuns.on_tiles``): the loaded
    variant has them."""
    return head_dim % TILE_DIMS == 0 and head_dim <= MAX_TILE_HEAD_DIM and hasattr(library(), "chunk_attention_amx")


def reads_int8() -> bool:
    """Whether the loaded variant reads (and writes) an int8 pool: avx512, avx2 and avx2vnni do."""
    return hasattr(library(), "decode_attention_q8")


def holds_pool(kv_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the loaded variant writes and reads a pool of ``kv_dtype`` with heads ``head_dim`` wide: bf16, or
    ``INT8_ROWS`` where it has the ``_q8`` functions and the heads split into whole scale groups."""
    return kv_dtype == torch.bfloat16 or (kv_dtype == INT8_ROWS and head_dim % KV_GROUP == 0 and reads_int8())


def covers(heads: int, kv_heads: int, head_dim: int, kv_dtype: torch.dtype) -> bool:
    """Whether the kernels attend for these heads over a K/V cache of ``kv_dtype`` (bf16, or ``INT8_ROWS``)."""
    return (library() is not None and holds_pool(kv_dtype, head_dim) and heads // kv_heads <= MAX_GROUPS
            and head_dim <= MAX_HEAD_DIM and head_dim % LANES == 0)


@dataclass(frozen=True)
class DecodeRuns:
    """The step's decode rows (their rows in the step's activations) and each one's runs of positions."""

    rows: torch.Tensor  # [D] int32
    first_run: torch.Tensor  # [D + 1] int32: row i's runs are first_run[i] … first_run[i + 1] - 1
    bounds: torch.Tensor  # [runs, 2] int32: each run's first position and the one after its last

    @staticmethod
    def of(rows: Sequence[int], runs: Sequence[tuple[slice, ...]]) -> DecodeRuns:
        first_run = [0]
        for row_runs in runs:
            first_run.append(first_run[-1] + len(row_runs))
        return DecodeRuns(_int32(list(rows)), _int32(first_run), _bounds(run for row_runs in runs for run in row_runs))

    def attend(self, q: torch.Tensor, out: torch.Tensor, layer_kv: torch.Tensor,
               sinks: torch.Tensor | None = None) -> None:
        """``q`` [R, H, hd] (already scaled) over ``layer_kv`` [2, Hkv, P, hd] bf16 (or int8 rows) into ``out``
        [R, H, hd] (all contiguous), at the decode rows only; query head ``h`` uses kv head ``h // (H / Hkv)``.
        ``sinks`` [H] fp32 (gpt-oss's) join each query head's softmax denominator as a position of value zero."""
        _, heads, head_dim = q.shape
        kv_heads, positions = layer_kv.shape[1], layer_kv.shape[2]
        function = library().decode_attention_q8 if layer_kv.dtype == INT8_ROWS else library().decode_attention
        function(address(q), address(out), kv_address(layer_kv), *self._addresses, heads, kv_heads, head_dim,
                 positions, _sinks_address(sinks, heads))

    @property
    def _addresses(self) -> tuple[int, int, int, int]:
        return self.rows.data_ptr(), len(self.rows), self.first_run.data_ptr(), self.bounds.data_ptr()


def _sinks_address(sinks: torch.Tensor | None, heads: int) -> int | None:
    """The kernels' pointer to ``sinks`` (None: none), which must be ``heads`` contiguous fp32 values."""
    if sinks is None:
        return None
    if sinks.dtype != torch.float32 or sinks.shape != (heads,) or not sinks.is_contiguous():
        raise ValueError(f"attention sinks must be {heads} contiguous fp32 values, "
                         f"not {sinks.dtype} {tuple(sinks.shape)}")
    return address(sinks)


def kv_address(layer_kv: torch.Tensor) -> int:
    """A layer of the pool, for the kernels' pointer (bf16, or int8 rows for the ``_q8`` functions); ValueError for
    any other dtype, which they would misread."""
    if layer_kv.dtype not in (torch.bfloat16, INT8_ROWS):
        raise ValueError(f"Hearth's attention kernels read a bf16 or int8 KV cache, not {layer_kv.dtype}.")
    return address(layer_kv)


def _int32(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _bounds(runs: Iterable[slice]) -> torch.Tensor:
    """Runs of positions as [runs, 2] int32: each one's first position and the one after its last."""
    return _int32([(run.start, run.stop) for run in runs]).view(-1, 2)


@dataclass(frozen=True)
class ChunkRuns:
    """A prompt chunk's rows (``first_row`` …, ``count`` of them, from position ``start`` counted from the runs'
    first position) and its sequence's runs of positions, for the chunk kernel: each row attends to the positions
    up to its own, only the last ``window`` of them where that is not 0."""

    first_row: int
    count: int
    start: int
    bounds: torch.Tensor  # [runs, 2] int32
    on_tiles: bool = False  # in bf16 on AMX's tiles (where ``int4_matmul.runs_on_amx`` and ``tiles_cover``; bf16 pool)
    window: int = 0

    @staticmethod
    def of(first_row: int, count: int, start: int, runs: tuple[slice, ...], on_tiles: bool = False,
           window: int | None = None) -> ChunkRuns:
        return ChunkRuns(first_row, count, start, _bounds(runs), on_tiles, window or 0)

    def attend(self, q: torch.Tensor, out: torch.Tensor, layer_kv: torch.Tensor,
               sinks: torch.Tensor | None = None) -> None:
        """``q`` [R, H, hd] (already scaled) over ``layer_kv`` [2, Hkv, P, hd] bf16 (or int8 rows) into ``out``
        [R, H, hd] (all contiguous), at the chunk's rows only; a model with ``sinks`` attends its chunks in PyTorch's
        ops (ValueError here)."""
        if sinks is not None:
            raise ValueError("the chunk kernels do not take attention sinks")
        _, heads, head_dim = q.shape
        kv_heads, positions = layer_kv.shape[1], layer_kv.shape[2]
        arguments = (address(q), address(out), kv_address(layer_kv), self.first_row, self.count, self.start,
                     self.bounds.data_ptr(), len(self.bounds), heads, kv_heads, head_dim, positions, self.window)
        if layer_kv.dtype == INT8_ROWS:
            library().chunk_attention_q8(*arguments)
        else:
            (library().chunk_attention_amx if self.on_tiles else library().chunk_attention)(*arguments)
