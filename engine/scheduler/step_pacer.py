"""How many prompt tokens a step may take beside its decoding rows, from what recent steps cost (engine thread).

Bookkeeping only, like the scheduler: the batch runner reports each step's forward
time, and the pacer keeps two moving averages: the time of a decode-only step, per
number of decoding rows, and what each prompt token added to the steps that had
some. A step with ``D`` decoding rows then takes as many prompt tokens as keep its
predicted time within ``PACE_RATIO`` decode-only steps of ``D`` rows: the running
streams' inter-token time while a long prompt joins stays bounded by their own, on any
machine and model. A token's cost grows with the positions it attends to, slowly from
one step to the next (a chunk is a few dozen of the prompt's positions), so the latest
steps' average follows it; a fixed budget (40 tokens) let a step late in a 2 000-token
prompt take 5.9 times a decode step on a 2-core Zen 4, with Hearth's kernels making
the decode step the faster. Until both averages exist the scheduler's fixed budget
applies.
"""

from __future__ import annotations

PACE_RATIO = 3.0
"""A step with prompt tokens within this many decode-only steps (forward time alone): the target is 3 times the
median inter-token time at the 99th percentile, which also holds each step's sampling and streaming."""
AVERAGE = 0.3  # the newest step's weight in each moving average
MIN_PROMPT_TOKENS = 8  # a prompt always moves on, however deep its context
MAX_PROMPT_TOKENS = 512


class StepPacer:
    def __init__(self, ratio: float = PACE_RATIO) -> None:
        self.ratio = ratio
        self._decode_ms: dict[int, float] = {}  # decode-only step time by decoding rows
        self._token_ms: float | None = None  # what a prompt token adds to a step

    def observe(self, decoding: int, prompt_tokens: int, ms: float) -> None:
        """A step of ``decoding`` one-token rows and ``prompt_tokens`` tokens of prompts ran in ``ms``."""
        if prompt_tokens == 0:
            self._decode_ms[decoding] = _averaged(self._decode_ms.get(decoding), ms)
            return
        baseline = self._decode_ms.get(decoding, 0.0 if decoding == 0 else None)
        if baseline is not None:
            self._token_ms = _averaged(self._token_ms, max(ms - baseline, 0.0) / prompt_tokens)

    def prompt_tokens(self, decoding: int) -> int | None:
        """Prompt tokens for a step beside ``decoding`` rows; None until a decode-only step of that many rows and
        a step with prompt tokens have been seen."""
        baseline = self._decode_ms.get(decoding)
        if baseline is None or self._token_ms is None:
            return None
        tokens = (self.ratio - 1) * baseline / max(self._token_ms, 1e-6)
        return int(min(max(tokens, MIN_PROMPT_TOKENS), MAX_PROMPT_TOKENS))


def _averaged(average: float | None, value: float) -> float:
    return value if average is None else average + AVERAGE * (value - average)
