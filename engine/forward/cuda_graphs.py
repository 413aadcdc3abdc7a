"""Runs the fixed-shape decode step as captured CUDA graphs (engine thread).

A graph is captured per cache and attention span, the first time that pair is
needed: that token runs eagerly, then the capture is stored on the cache (its
buffer's address is what the graph writes), and later tokens replay it — one
launch for the whole step instead of hundreds. All graphs share one memory pool;
only one runs at a time. Before the first capture the step runs twice on the
capture stream, so lazy initialisation (cuBLAS workspaces, Triton tuning) happens
outside the capture.

A capture that fails turns graphs off for good: the step keeps running eagerly
and ``disabled_reason`` says why (the loader shows it as a notice). Running out of
memory is not such a failure: it is raised, as from any other step.
"""

from __future__ import annotations

import torch

from engine.forward.cuda_step import DecodeStep, StaticKVCache, span_for

WARMUP_RUNS = 2


class GraphRunner:
    """The decode step for one backend: replayed from graphs where it can be, else eager."""

    def __init__(self, step: DecodeStep, use_graphs: bool) -> None:
        self.step = step
        self.use_graphs = use_graphs and step.device.type == "cuda"
        self.disabled_reason: str | None = None
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._stream = torch.cuda.Stream(step.device) if self.use_graphs else None
        self._warm = False

    def run(self, cache: StaticKVCache, token: int, position: int) -> torch.Tensor:
        """Logits [V] fp32 after ``token`` at ``position``, whose keys and values land in ``cache``."""
        self.step.set_input(token, position)
        span = span_for(position + 1, cache.capacity)
        captured = cache.graphs.get(span) if self.use_graphs else None
        if captured is not None:
            graph, logits = captured
            graph.replay()
            return logits.clone()  # the graph overwrites its output on the next replay
        logits = self.step(cache.buffer, span)
        if self.use_graphs:
            self._capture(cache, span)
        return logits

    def disable(self, reason: str) -> None:
        self.use_graphs = False
        self.disabled_reason = reason

    def _capture(self, cache: StaticKVCache, span: int) -> None:
        """Capture the step over ``cache`` for ``span``; rerunning it rewrites the same keys and values."""
        try:
            self._warm_up(cache, span)
            captured = self._record(cache, span)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # any capture failure: stay correct, only slower
            self.disable(f"{type(exc).__name__}: {exc}")
            torch.cuda.synchronize(self.step.device)
            return
        cache.graphs[span] = captured

    def _record(self, cache: StaticKVCache, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture on the side stream. ``torch.cuda.graph()`` would also run a full garbage collection
        and empty the allocator's cache before each capture, which costs more than the capture itself."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.step.device)
        with torch.cuda.stream(self._stream):
            graph.capture_begin(pool=self._pool)
            try:
                logits = self.step(cache.buffer, span)  # [V], lives in the pool
            finally:
                graph.capture_end()
        return graph, logits

    def _warm_up(self, cache: StaticKVCache, span: int) -> None:
        if self._warm:
            return
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.step.device))
        with torch.cuda.stream(self._stream):
            for _ in range(WARMUP_RUNS):
                self.step(cache.buffer, span)
        torch.cuda.current_stream(self.step.device).wait_stream(self._stream)
        self._warm = True
