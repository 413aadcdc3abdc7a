"""How many prompt tokens a step may take beside its decoding rows, from what recent steps cost (engine thread).

Bookkeeping only, like the scheduler: the batch runner reports each step's forward
time, and the pacer keeps two estimates: the time of a decode-only step, per number
of decoding rows (the median of the latest ``BASELINE_STEPS``, so that one step slowed
by the machine moves nothing), and what each prompt token added to the steps that had
some (the median of the latest ``TOKEN_STEPS``: one step the machine slowed does not
shrink the next few, a slowdown that lasts moves it within three). A step with ``D`` decoding rows then takes
as many prompt tokens as keep its predicted time within ``PACE_RATIO`` decode-only steps
of ``D`` rows: the running streams' inter-token time while a long prompt joins stays
bounded by their own, on any machine and model. A prompt's own steps (nothing decoding, big chunks) cost less a
token, so they only stand in, doubled, until a step beside decoding rows is seen. A
token's cost grows with the positions it attends to, slowly from one step to the next
(a chunk is a few dozen of the prompt's positions), so the latest steps' median
follows it; a fixed budget would let the steps late in a long prompt take
many times a decode step, the more so the faster Hearth's kernels make the decode
step. Until both estimates exist the scheduler's fixed budget applies.
"""

from __future__ import annotations

import statistics
from collections import deque

PACE_RATIO = 2.5
"""A step with prompt tokens within this many decode-only steps, in forward time alone: under the target's 3 times the
median inter-token time at the 99th percentile, which is about the slowest step of a join (7 streams' gaps a step).
The margin is for steps the machine slows; a higher ratio brings the joining prompt's first token sooner but takes
the streams' slowest gaps past the target."""
AVERAGE = 0.5  # the newest step's weight in the moving average of a prompt's own steps
BASELINE_STEPS = 9  # decode-only steps of one size whose median is the baseline
TOKEN_STEPS = 5  # steps beside decoding rows whose median cost a prompt token prices the next step's
SMALL_CHUNK_COST = 2.0
"""A prompt token in a chunk beside decoding rows against one in a prompt's own steps (big chunks, big matmuls): the
small chunk's token costs more, so before any such step is seen the pacer assumes twice the cost, a little above what
the built-in model shows."""
MIN_PROMPT_TOKENS = 8  # a prompt always moves on, however deep its context
MAX_PROMPT_TOKENS = 512


class StepPacer:
    def __init__(self, ratio: float = PACE_RATIO) -> None:
        self.ratio = ratio
        self._decode_ms: dict[int, deque[float]] = {}  # the latest decode-only step times by decoding rows
        self._token_ms: deque[float] = deque(maxlen=TOKEN_STEPS)  # what a prompt token added to the latest such steps
        self._prefill_token_ms: float | None = None  # what one costs in a step without any

    def observe(self, decoding: int, prompt_tokens: int, ms: float) -> None:
        """A step of ``decoding`` one-token rows and ``prompt_tokens`` tokens of prompts ran in ``ms``."""
        if prompt_tokens == 0:
            self._decode_ms.setdefault(decoding, deque(maxlen=BASELINE_STEPS)).append(ms)
            return
        if decoding == 0:
            self._prefill_token_ms = _averaged(self._prefill_token_ms, ms / prompt_tokens)
        elif decoding in self._decode_ms:
            self._token_ms.append(max(ms - self._baseline(decoding), 0.0) / prompt_tokens)

    def prompt_tokens(self, decoding: int) -> int | None:
        """Prompt tokens for a step beside ``decoding`` rows; None until a decode-only step of that many rows and
        a step with prompt tokens have been seen."""
        baseline = self._baseline(decoding)
        token_ms = statistics.median(self._token_ms) if self._token_ms else None
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
