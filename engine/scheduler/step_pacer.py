"""How many prompt tokens a step may take beside its decoding rows, from what recent steps cost (engine thread).

Bookkeeping only, like the scheduler: the batch runner reports each step's forward
time, and the pacer keeps two estimates: the time of a decode-only step, per number
of decoding rows (the median of the latest ``BASELINE_STEPS``, so that one step slowed
by the machine moves nothing), and what each prompt token added to the steps that had
some (rising at once to a dearer step, falling halfway to a cheaper one: the bound is on
the worst steps, so the estimate errs high). A step with ``D`` decoding rows then takes
as many prompt tokens as keep its predicted time within ``PACE_RATIO`` decode-only steps
of ``D`` rows: the running streams' inter-token time while a long prompt joins stays
bounded by their own, on any machine and model. A prompt's own steps (nothing decoding, big chunks) cost less a
token, so they only stand in, doubled, until a step beside decoding rows is seen. A
token's cost grows with the positions it attends to, slowly from one step to the next
(a chunk is a few dozen of the prompt's positions), so the latest steps' average
follows it; a fixed budget (40 tokens) let a step late in a 2 000-token
prompt take 5.9 times a decode step on a 2-core Zen 4, with Hearth's kernels making
the decode step the faster. Until both averages exist the scheduler's fixed budget
applies.
"""

from __future__ import annotations

import statistics
from collections import deque

PACE_RATIO = 2.7
"""A step with prompt tokens within this many decode-only steps, in forward time alone: under the target's 3 times the
median inter-token time at the 99th percentile, which is about the slowest step of a join (7 streams' gaps a step).
The margin is for steps the machine slows. 2-core Sapphire Rapids with AMX tiles, medians of 3 rounds: 3.0 gave a
p99 of 3.14 times the median (2.90-3.42) with the prompt's first token 1.75 times later than alone; 2.7 gave 2.80
(2.70-2.84) and 1.65 (1.39-2.15)."""
AVERAGE = 0.5  # the newest step's weight in the moving averages (a cheaper prompt token's)
BASELINE_STEPS = 9  # decode-only steps of one size whose median is the baseline
SMALL_CHUNK_COST = 2.0
"""A prompt token in a chunk beside decoding rows against one in a prompt's own steps (big chunks, big matmuls):
about 2.2 against 1.4 ms for the built-in model, so before any such step is seen the pacer assumes twice the cost."""
MIN_PROMPT_TOKENS = 8  # a prompt always moves on, however deep its context
MAX_PROMPT_TOKENS = 512


class StepPacer:
    def __init__(self, ratio: float = PACE_RATIO) -> None:
        self.ratio = ratio
        self._decode_ms: dict[int, deque[float]] = {}  # the latest decode-only step times by decoding rows
        self._token_ms: float | None = None  # what a prompt token adds to a step beside decoding rows
        self._prefill_token_ms: float | None = None  # what one costs in a step without any

    def observe(self, decoding: int, prompt_tokens: int, ms: float) -> None:
        """A step of ``decoding`` one-token rows and ``prompt_tokens`` tokens of prompts ran in ``ms``."""
        if prompt_tokens == 0:
            self._decode_ms.setdefault(decoding, deque(maxlen=BASELINE_STEPS)).append(ms)
            return
        if decoding == 0:
            self._prefill_token_ms = _averaged(self._prefill_token_ms, ms / prompt_tokens)
        elif decoding in self._decode_ms:
            token_ms = max(ms - self._baseline(decoding), 0.0) / prompt_tokens
            self._token_ms = max(token_ms, _averaged(self._token_ms, token_ms))

    def prompt_tokens(self, decoding: int) -> int | None:
        """Prompt tokens for a step beside ``decoding`` rows; None until a decode-only step of that many rows and
        a step with prompt tokens have been seen."""
        baseline, token_ms = self._baseline(decoding), self._token_ms
        if token_ms is None and self._prefill_token_ms is not None:
            token_ms = SMALL_CHUNK_COST * self._prefill_token_ms
        if baseline is None or token_ms is None:
            return None
        tokens = (self.ratio - 1) * baseline / max(token_ms, 1e-6)
        return int(min(max(tokens, MIN_PROMPT_TOKENS), MAX_PROMPT_TOKENS))

    def _baseline(self, decoding: int) -> float | None:
        steps = self._decode_ms.get(decoding)
        return statistics.median(steps) if steps else None


def _averaged(average: float | None, value: float) -> float:
    return value if average is None else average + AVERAGE * (value - average)
