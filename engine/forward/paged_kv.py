"""The keys and values of every sequence in fixed-size blocks of one preallocated tensor (engine thread).

Block ``b`` is positions ``b * block_size … (b + 1) * block_size - 1`` of the
position axis; which blocks a sequence owns, in order, is its block table, kept by
the scheduler (``engine/scheduler``). A step's ``StepLayout`` turns each sequence's
table into where its new keys go (a plain slice when its blocks lie one after another,
a single stream nearly always, otherwise its positions) and the runs of blocks all of
its keys are read from: one, or two for a sequence that reuses another's prefix.

The buffer's dtype is the plan's ``kv_cache`` (``FormatPlan``): bf16 on the CPU, where the
forward pass computes in fp32, so a write rounds (to nearest even) and a reader widens. An int8
cache (``kv_layout``) holds each head's row as bytes (``INT8_ROWS``): its int8 codes, then an fp16
scale per 32 of them; a write quantizes (``kv_int8``), a reader dequantizes to fp32.

Layers may keep their keys in several KV groups (``windows.KVGroups``): a block then
holds one group's layers (``page_layers`` of them), each sequence has a table per
group, and a window group's runs start at the window of the span's first row (its
earlier blocks may be gone), so the layout is made group by group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.forward.kv_int8 import dequantize_rows, quantize_rows
from engine.forward.kv_layout import kv_row_bytes
from engine.forward.windows import window_start

INT8_ROWS = torch.uint8
"""The buffer's dtype where it holds int8 rows (``kv_layout``: codes, then fp16 scales, as bytes)."""

@dataclass(frozen=True)
class BatchRow:
    """One sequence in a step: ``token_ids`` at positions ``start…``, held in blocks ``block_ids`` (KV group 0's
    table) and ``group_tables`` (groups 1 …, where the model has several). ``logit_rows``: how many of its last
    tokens the step returns logits for (a speculative draft's verification takes each drafted token's)."""

    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]
    group_tables: tuple[Sequence[int], ...] = ()
    logit_rows: int = 1

    @property
    def tables(self) -> tuple[Sequence[int], ...]:
        return (self.block_ids, *self.group_tables)


Positions = slice | torch.Tensor  # a run of the position axis, or the positions themselves [T]


@dataclass(frozen=True)
class SequenceSpan:
    rows: slice  # this sequence's rows in the step's [R, …] activations
    start: int
    length: int
    runs: tuple[slice, ...]  # where its positions first … start+length-1 lie: runs of the position axis
    first: int = 0  # the first position its rows see: 0, or the window's start of its first row


@dataclass(frozen=True)
class GroupLayout:
    """One KV group's part of a step: each sequence's span and runs, and where the new keys go."""

    spans: tuple[SequenceSpan, ...]
    write: Positions  # where each of the step's R new positions goes, in row order


@dataclass(frozen=True)
class StepLayout:
    groups: tuple[GroupLayout, ...]
    positions: Positions  # each row's position in its sequence (a slice for a single sequence)
    last_rows: slice | torch.Tensor  # each sequence's last ``logit_rows`` rows, in row order, [sum of logit_rows]

    @property
    def spans(self) -> tuple[SequenceSpan, ...]:
        """Group 0's spans: every group's have the same rows, starts and lengths."""
        return self.groups[0].spans


class PagedKV:
    """``[L, 2, Hkv, blocks × block_size, hd]``: keys and values of ``layers`` layers (a page: every layer of a
    model with one KV group), block by block. ``windows``: each KV group's window (``KVGroups.windows``). With
    ``dtype`` ``INT8_ROWS`` the last axis is an int8 row's bytes, ``hd + hd / 16`` (``kv_layout``)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, windows: tuple[int | None, ...] = (None,)) -> None:
        self.windows = windows
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        self.int8 = dtype == INT8_ROWS
        row = kv_row_bytes("int8", head_dim) if self.int8 else head_dim
        self.buffer = torch.empty((layers, 2, kv_heads, num_blocks * block_size, row), dtype=dtype, device=device)

    @property
    def bytes_per_block(self) -> int:
        layers, pair, kv_heads, _, head_dim = self.buffer.shape
        return layers * pair * kv_heads * self.block_size * head_dim * self.buffer.element_size()

    def copy_block(self, source: int, target: int, tokens: int) -> None:
        """The first ``tokens`` positions of block ``source`` into block ``target`` (copy on write)."""
        size = self.block_size
        self.buffer[:, :, :, target * size : target * size + tokens] = self.buffer[:, :, :, source * size : source * size + tokens]

    def layout(self, rows: Sequence[BatchRow]) -> StepLayout:
        groups = tuple(self._group_layout(rows, group) for group in range(len(self.windows)))
        spans = groups[0].spans
        if len(rows) == 1:  # one sequence, nearly always in one run of blocks: slices throughout
            span = spans[0]
            return StepLayout(groups, slice(span.start, span.start + span.length),
                              slice(span.length - rows[0].logit_rows, span.length))
        positions = torch.cat([torch.arange(span.start, span.start + span.length) for span in spans])  # [R]
        last_rows = torch.tensor([index for span, row in zip(spans, rows)
                                  for index in range(span.rows.stop - row.logit_rows, span.rows.stop)],
                                 device=self.device)  # [sum of logit_rows]
        return StepLayout(groups, positions.to(self.device), last_rows)

    def _group_layout(self, rows: Sequence[BatchRow], group: int) -> GroupLayout:
        """Group ``group``'s spans (runs from each span's first seen position) and writes."""
        spans, writes, first_row = [], [], 0
        for row in rows:
            length, table = len(row.token_ids), row.tables[group]
            end = row.start + length
            first = window_start(row.start, self.windows[group])
            spans.append(SequenceSpan(slice(first_row, first_row + length), row.start, length,
                                      self._runs(table, first, end), first))
            writes.append(self._positions(table, row.start, end))
            first_row += length
        if len(rows) == 1:
            return GroupLayout(tuple(spans), writes[0])
        return GroupLayout(tuple(spans), torch.cat([_as_tensor(w) for w in writes]).to(self.device))  # [R]

    def write(self, layer: int, where: Positions, keys_values: torch.Tensor) -> None:
        """Store ``keys_values`` [2, Hkv, R, hd] at the step's new positions, in the buffer's dtype (int8 rows
        quantized)."""
        held = self.buffer[layer]  # [2, Hkv, P, hd] (int8: [2, Hkv, P, row bytes])
        if self.int8:
            keys_values = quantize_rows(keys_values)  # [2, Hkv, R, row bytes]
        if isinstance(where, slice):
            held[:, :, where] = keys_values
        else:
            held.index_copy_(2, where, keys_values.to(held.dtype))

    def read(self, layer: int, runs: tuple[slice, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's keys and values so far, [Hkv, T, hd] each in the buffer's dtype: views of its one run, else its
        runs joined; an int8 cache's dequantized to fp32."""
        held = self.buffer[layer]  # [2, Hkv, P, hd]
        parts = [held.narrow(2, run.start, run.stop - run.start) for run in runs]
        pair = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # [2, Hkv, T, hd]
        if self.int8:
            pair = dequantize_rows(pair)  # [2, Hkv, T, hd] fp32
        return pair[0], pair[1]

    def layer_runs(self, runs: tuple[slice, ...]) -> Sequence[tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
        """A sequence's keys, transposed, and values in each layer, run by run: [Hkv, hd, n] and [Hkv, n, hd] views
        of every layer made once per step (they see what each layer writes later), for attention to read in place;
        an int8 cache's dequantized when a layer asks for them (``DequantizedRuns``)."""
        if self.int8:
            return DequantizedRuns(self, runs)
        per_run = []
        for run in runs:
            keys, values = self.buffer.narrow(3, run.start, run.stop - run.start).unbind(1)  # [L, Hkv, n, hd] each
            per_run.append(zip(keys.transpose(2, 3).unbind(0), values.unbind(0)))
        return list(zip(*per_run))

    def _runs(self, block_ids: Sequence[int], start: int, end: int) -> tuple[slice, ...]:
        """Positions start … end-1 of a sequence held in ``block_ids``, as runs of consecutive blocks: one for a
        sequence that grew alone, two for one that reuses another's prefix, then its own blocks."""
        size = self.block_size
        last = (end - 1) // size
        runs, first, begin = [], start // size, start
        for index in range(first + 1, last + 2):
            if index <= last and block_ids[index] == block_ids[index - 1] + 1:
                continue
            slot = block_ids[first] * size + begin - first * size
            runs.append(slice(slot, slot + min(index * size, end) - begin))
            first, begin = index, index * size
        return tuple(runs)

    def _positions(self, block_ids: Sequence[int], start: int, end: int) -> Positions:
        size = self.block_size
        first, last = start // size, (end - 1) // size
        base = block_ids[first]
        if all(block_ids[i] == base + i - first for i in range(first, last + 1)):
            offset = base * size - first * size
            return slice(offset + start, offset + end)
        blocks = torch.tensor(block_ids[first : last + 1], dtype=torch.long)  # [n]
        slots = (blocks.unsqueeze(1) * size + torch.arange(size)).flatten()  # [n * size]
        return slots[start - first * size : end - first * size].to(self.device)


class DequantizedRuns:
    """``PagedKV.layer_runs`` of an int8 cache: layer ``i``'s runs, dequantized to fp32 when indexed (after the
    layer has written its step's keys)."""

    def __init__(self, kv: PagedKV, runs: tuple[slice, ...]) -> None:
        self._kv, self._runs = kv, runs

    def __getitem__(self, layer: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        held = self._kv.buffer[layer]  # [2, Hkv, P, row bytes]
        pairs = [dequantize_rows(held.narrow(2, run.start, run.stop - run.start)) for run in self._runs]
        return tuple((keys.transpose(1, 2), values) for keys, values in pairs)  # ([Hkv, hd, n], [Hkv, n, hd]) each


def _as_tensor(where: Positions) -> torch.Tensor:
    return torch.arange(where.start, where.stop) if isinstance(where, slice) else where.cpu()
