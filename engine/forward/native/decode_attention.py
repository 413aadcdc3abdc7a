"""Every decode row's attention of a batched step in one call per layer, read in place from the block pool (engine
thread).

A decode row is one query token over its sequence's keys and values, which lie in one
or two runs of the pool's position axis. In PyTorch ops that is two small ``bmm`` and a
softmax per row and layer: a batch of 8 made 480 of each a step, about 21 µs apiece,
most of it dispatch and thread wake-up. ``DecodeRuns`` turns the step's rows and runs
into index tensors once; ``attend`` then runs all rows and kv heads of one layer in the
kernel, with the softmax's running maximum kept per query head (one pass over the
positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.forward.native.build import address, library

MAX_GROUPS, MAX_HEAD_DIM = 16, 256  # the kernel's per-task arrays (``kernels.c``)
LANES = 16  # fp32 values a vector: a head's dimensions come whole vectors


def covers(heads: int, kv_heads: int, head_dim: int) -> bool:
    return (library() is not None and heads // kv_heads <= MAX_GROUPS and head_dim <= MAX_HEAD_DIM
            and head_dim % LANES == 0)


@dataclass(frozen=True)
class DecodeRuns:
    """The step's decode rows (their rows in the step's activations) and each one's runs of positions."""

    rows: torch.Tensor  # [D] int32
    first_run: torch.Tensor  # [D + 1] int32: row i's runs are first_run[i] … first_run[i + 1] - 1
    bounds: torch.Tensor  # [runs, 2] int32: each run's first position and the one after its last

    @staticmethod
    def of(rows: Sequence[int], runs: Sequence[tuple[slice, ...]]) -> DecodeRuns:
        bounds = [(run.start, run.stop) for row_runs in runs for run in row_runs]
        first_run = [0]
        for row_runs in runs:
            first_run.append(first_run[-1] + len(row_runs))
        return DecodeRuns(_int32(list(rows)), _int32(first_run), _int32(bounds).view(-1, 2))

    def attend(self, q: torch.Tensor, out: torch.Tensor, layer_kv: torch.Tensor) -> None:
        """``q`` [R, H, hd] (already scaled) over ``layer_kv`` [2, Hkv, P, hd] into ``out`` [R, H, hd] (contiguous),
        at the decode rows only; query head ``h`` uses kv head ``h // (H / Hkv)``."""
        _, heads, head_dim = q.shape
        kv_heads, positions = layer_kv.shape[1], layer_kv.shape[2]
        q = q.contiguous()  # the step's queries are a view of its q, k, v projections
        library().decode_attention(q.data_ptr(), address(out), address(layer_kv), *self._addresses, heads, kv_heads,
                                   head_dim, positions)

    @property
    def _addresses(self) -> tuple[int, int, int, int]:
        return self.rows.data_ptr(), len(self.rows), self.first_run.data_ptr(), self.bounds.data_ptr()


def _int32(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)
