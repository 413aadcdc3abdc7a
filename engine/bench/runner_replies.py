"""Replies through the engine's batch runner, as the window and the server get them (the bench's main thread).

A ``ReplyDriver`` is one ``BatchRunner`` over the loaded model, with its own KV pool
sized for the positions a measurement needs, driven the way the runtime drives it:
a request is added with its ``ReplyEvents``, then the runner steps until the reply's
``ReplyFinished`` (or ``ReplyFailed``) arrives. Its figures are the ones the user
sees: time to first token, prefill time, decode rate, reused prompt tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

from engine.chat.prompt import PromptPlan
from engine.forward.backend import HFBackend
from engine.host.memory import read_memory
from engine.models.loading import LoadedModel
from engine.protocol.messages import GREEDY, ReplyFailed, ReplyFinished, RequestStats, SamplingParams
from engine.scheduler.block_pool import BLOCK_SIZE
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents

POOL_SPARE_BLOCKS = 4  # beyond the positions asked for: a partly filled block copied on reuse, say


@dataclass(frozen=True)
class Reply:
    text: str
    stats: RequestStats


class ReplyDriver:
    """A fresh batch runner over ``loaded`` whose pool holds ``positions`` positions."""

    def __init__(self, loaded: LoadedModel, positions: int, stop_at_eos: bool = True) -> None:
        """``stop_at_eos``: False lets every reply run to its ``max_new_tokens`` (a fixed decode length)."""
        if isinstance(loaded.backend, HFBackend):
            raise ValueError(f"{type(loaded.backend).__name__} runs one request at a time: the bench needs a fast path.")
        self.loaded = loaded if stop_at_eos else replace(loaded, eos_ids=frozenset())
        self._finished: dict[str, ReplyFinished | ReplyFailed] = {}
        one_block = loaded.backend.new_pool(1, BLOCK_SIZE)
        block_bytes = one_block.bytes_per_block
        blocks = -(-positions // BLOCK_SIZE) * len(one_block.windows) + POOL_SPARE_BLOCKS  # a block per KV group
        self.runner = BatchRunner(self.loaded, self._emit, lambda _: False, budget_bytes=blocks * block_bytes)
        self._count = 0

    def _emit(self, event: Any) -> None:
        if isinstance(event, (ReplyFinished, ReplyFailed)):
            self._finished[event.request_id] = event

    def reply(self, prompt_ids: Sequence[int], max_new_tokens: int, conversation_id: str = "bench",
              sampling: SamplingParams = GREEDY) -> Reply:
        """One reply to ``prompt_ids`` (greedy unless ``sampling`` says otherwise), stepped to its end; its prefix
        is reused from earlier replies of this driver where the pool still holds it."""
        self._count += 1
        request_id = f"r{self._count}"
        events = ReplyEvents(self._emit, request_id, PromptPlan(list(prompt_ids), ()), 0.0, self.loaded.context_length,
                             time.perf_counter())
        self.runner.add(request_id, conversation_id, list(prompt_ids), replace(sampling, max_new_tokens=max_new_tokens),
                        events)
        while request_id not in self._finished:
            self.runner.step(lambda held: read_memory(self.loaded.device, self.loaded.weight_bytes, held, held))
        done = self._finished.pop(request_id)
        if isinstance(done, ReplyFailed):
            raise RuntimeError(done.message)
        return Reply(events.text, done.stats)
