"""Captures fixed-shape decode steps as CUDA graphs and replays them (engine thread).

A batch-size bucket's step over a block pool (``cuda_batch``) is captured the first
time it runs: that step runs eagerly, then the capture is stored on the pool (its
buffer's address is what the graph writes), and later steps replay it — one launch
for the whole step instead of hundreds. All graphs share one memory pool; only one
runs at a time. Before the first capture of each kind of step it runs twice on the
capture stream, so lazy initialisation (cuBLAS workspaces, Triton compiling and
tuning) happens outside the capture.

A capture that fails turns graphs off for good: the step keeps running eagerly
and ``disabled_reason`` says why (the loader shows it as a notice). Running out of
memory is not such a failure: it is raised, as from any other step.
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch

WARMUP_RUNS = 2

Captured = tuple[torch.cuda.CUDAGraph, torch.Tensor]  # a graph and the output tensor it writes
Step = Callable[[], torch.Tensor]  # a fixed-shape step over inputs already written in place


class GraphRunner:
    """One backend's captures on ``device``: on while ``use_graphs``, off for good once a capture fails."""

    def __init__(self, device: torch.device, use_graphs: bool = True) -> None:
        """``use_graphs``: False keeps every step eager (the CPU always does)."""
        self.device = device
        self.use_graphs = use_graphs and device.type == "cuda"
        self.disabled_reason: str | None = None
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._stream = torch.cuda.Stream(device) if self.use_graphs else None
        self._warmed: set[Hashable] = set()

    def disable(self, reason: str) -> None:
        self.use_graphs = False
        self.disabled_reason = reason

    def capture(self, step: Step, kind: Hashable) -> Captured | None:
        """Capture ``step`` (which rewrites the same keys and values when rerun), warming up the first step of
        each ``kind``; ``None`` if capturing fails, which turns graphs off for good."""
        try:
            if kind not in self._warmed:
                self._warm_up(step)
                self._warmed.add(kind)
            return self._record(step)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # any capture failure: stay correct, only slower
            self.disable(f"{type(exc).__name__}: {exc}")
            torch.cuda.synchronize(self.device)
            return None

    def _record(self, step: Step) -> Captured:
        """Capture on the side stream. ``torch.cuda.graph()`` would also run a full garbage collection
        and empty the allocator's cache before each capture, which costs more than the capture itself."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        with torch.cuda.stream(self._stream):
            graph.capture_begin(pool=self._pool)
            try:
                output = step()  # lives in the pool
            finally:
                graph.capture_end()
        return graph, output

    def _warm_up(self, step: Step) -> None:
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(WARMUP_RUNS):
                step()
        torch.cuda.current_stream(self.device).wait_stream(self._stream)


def replay(captured: Captured) -> torch.Tensor:
    """Run a captured step; a copy of its output, which the graph overwrites on its next replay."""
    graph, output = captured
    graph.replay()
    return output.clone()
