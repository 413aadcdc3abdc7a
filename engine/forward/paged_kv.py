"""The keys and values of every sequence in fixed-size blocks of one preallocated tensor (engine thread).

Block ``b`` is positions ``b * block_size … (b + 1) * block_size - 1`` of the
position axis; which blocks a sequence owns, in order, is its block table, kept by
the scheduler (``engine/scheduler``). A step's ``StepLayout`` turns each sequence's
table into where its new keys go (a plain slice when its blocks lie one after another,
a single stream nearly always, otherwise its positions) and the runs of blocks all of
its keys are read from: one, or two for a sequence that reuses another's prefix.

The buffer's dtype is the plan's ``kv_cache`` (``FormatPlan``): bf16 on the CPU, where the
forward pass computes in fp32, so a write rounds (to nearest even) and a reader widens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class BatchRow:
    """One sequence in a step: ``token_ids`` at positions ``start…``, held in blocks ``block_ids``."""

    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]


Positions = slice | torch.Tensor  # a run of the position axis, or the positions themselves [T]


@dataclass(frozen=True)
class SequenceSpan:
    rows: slice  # this sequence's rows in the step's [R, …] activations
    start: int
    length: int
    runs: tuple[slice, ...]  # where all of its positions, 0 … start+length-1, lie: runs of the position axis


@dataclass(frozen=True)
class StepLayout:
    spans: tuple[SequenceSpan, ...]
    write: Positions  # where each of the step's R new positions goes, in row order
    positions: Positions  # each row's position in its sequence (a slice for a single sequence)
    last_rows: slice | torch.Tensor  # each sequence's last row, [B]


class PagedKV:
    """``[L, 2, Hkv, blocks × block_size, hd]``: keys and values of every layer, block by block."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        self.buffer = torch.empty((layers, 2, kv_heads, num_blocks * block_size, head_dim), dtype=dtype, device=device)

    @property
    def bytes_per_block(self) -> int:
        layers, pair, kv_heads, _, head_dim = self.buffer.shape
        return layers * pair * kv_heads * self.block_size * head_dim * self.buffer.element_size()

    def copy_block(self, source: int, target: int, tokens: int) -> None:
        """The first ``tokens`` positions of block ``source`` into block ``target`` (copy on write)."""
        size = self.block_size
        self.buffer[:, :, :, target * size : target * size + tokens] = self.buffer[:, :, :, source * size : source * size + tokens]

    def layout(self, rows: Sequence[BatchRow]) -> StepLayout:
        spans, writes, first = [], [], 0
        for row in rows:
            length = len(row.token_ids)
            end = row.start + length
            spans.append(SequenceSpan(slice(first, first + length), row.start, length, self._runs(row.block_ids, end)))
            writes.append(self._positions(row.block_ids, row.start, end))
            first += length
        if len(rows) == 1:  # one sequence, nearly always in one run of blocks: slices throughout
            return StepLayout(tuple(spans), writes[0], slice(rows[0].start, end), slice(first - 1, first))
        write = torch.cat([_as_tensor(w) for w in writes]).to(self.device)  # [R]
        positions = torch.cat([torch.arange(span.start, span.start + span.length) for span in spans])  # [R]
        last_rows = torch.tensor([span.rows.stop - 1 for span in spans], device=self.device)  # [B]
        return StepLayout(tuple(spans), write, positions.to(self.device), last_rows)

    def write(self, layer: int, where: Positions, keys_values: torch.Tensor) -> None:
        """Store ``keys_values`` [2, Hkv, R, hd] at the step's new positions, in the buffer's dtype."""
        held = self.buffer[layer]  # [2, Hkv, P, hd]
        if isinstance(where, slice):
            held[:, :, where] = keys_values
        else:
            held.index_copy_(2, where, keys_values.to(held.dtype))

    def read(self, layer: int, runs: tuple[slice, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's keys and values so far, [Hkv, T, hd] each in the buffer's dtype: views of its one run, else its
        runs joined."""
        held = self.buffer[layer]  # [2, Hkv, P, hd]
        parts = [held.narrow(2, run.start, run.stop - run.start) for run in runs]
        pair = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # [2, Hkv, T, hd]
        return pair[0], pair[1]

    def layer_runs(self, runs: tuple[slice, ...]) -> list[tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
        """A sequence's keys, transposed, and values in each layer, run by run: [Hkv, hd, n] and [Hkv, n, hd] views
        of every layer made once per step (they see what each layer writes later), for attention to read in place."""
        per_run = []
        for run in runs:
            keys, values = self.buffer.narrow(3, run.start, run.stop - run.start).unbind(1)  # [L, Hkv, n, hd] each
            per_run.append(zip(keys.transpose(2, 3).unbind(0), values.unbind(0)))
        return list(zip(*per_run))

    def _runs(self, block_ids: Sequence[int], end: int) -> tuple[slice, ...]:
        """Positions 0 … end-1 of a sequence held in ``block_ids``, as runs of consecutive blocks: one for a
        sequence that grew alone, two for one that reuses another's prefix, then its own blocks."""
        size = self.block_size
        last = (end - 1) // size
        runs, first = [], 0
        for index in range(1, last + 2):
            if index <= last and block_ids[index] == block_ids[index - 1] + 1:
                continue
            begin = block_ids[first] * size
            runs.append(slice(begin, begin + min(index * size, end) - first * size))
            first = index
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


def _as_tensor(where: Positions) -> torch.Tensor:
    return torch.arange(where.start, where.stop) if isinstance(where, slice) else where.cpu()
