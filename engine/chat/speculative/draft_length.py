"""How many tokens to draft next, from how the recent drafts fared (engine thread).

A draft of k tokens costs its sequence k more rows in the step; each accepted one
saves a whole step. ``DraftLength`` grows k while drafts are accepted whole and
cuts it to just past the accepted run when one is rejected. It keeps a running
mean of what a drafting step gained: tokens accepted less ``row_cost`` per drafted
token (what a row of the step costs, in steps, plus what drafting it cost: the draft
source's ``row_cost``). When that mean falls below zero,
drafting pauses for a number of steps that doubles each time it pauses again, so a
reply whose text does not repeat its context soon stops paying for drafts.
"""

from __future__ import annotations

FIRST_LENGTH = 4
MAX_LENGTH = 8
ROW_COST = 0.25
"""A drafted row's cost in decode steps. A step of a few rows reads the weights once, as one row does, but a small
model's weights stay in the CPU's caches and its rows' arithmetic sets the time: with the built-in model a step of 5
rows took about twice one row's CPU time, one of 9 about 3.6 times (a larger model, whose weights' reads set the
time, pays less a row)."""
GAIN_MEMORY = 0.7  # the running mean's weight on what came before
FIRST_PAUSE = 8
LONGEST_PAUSE = 256


class DraftLength:
    """One sequence's next draft length, or 0 while drafting pauses."""

    def __init__(self, row_cost: float = ROW_COST) -> None:
        """``row_cost``: a drafted token's cost in decode steps (``DraftSource.row_cost``). A first draft (and the
        first after a pause) costs what ``FIRST_LENGTH`` tokens cost at ``ROW_COST``: fewer tokens where each costs
        more (a draft model's, a mixture of experts' rows), at least one."""
        self.row_cost = row_cost
        self._first = max(1, min(FIRST_LENGTH, round(FIRST_LENGTH * ROW_COST / row_cost)))
        self.length = self._first
        self.gain = 1.0  # running mean of (accepted - row_cost * drafted) per drafting step
        self._pause = FIRST_PAUSE
        self._paused_for = 0  # steps left without drafting

    def next(self) -> int:
        """Tokens to draft at this step (0: pausing); each call while paused is one step of the pause."""
        if self._paused_for > 0:
            self._paused_for -= 1
            return 0
        return self.length

    def record(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens was verified and its first ``accepted`` kept."""
        self.length = min(self.length * 2, MAX_LENGTH) if accepted == drafted else max(accepted + 1, 1)
        self.gain = GAIN_MEMORY * self.gain + (1 - GAIN_MEMORY) * (accepted - self.row_cost * drafted)
        if self.gain >= 0:
            self._pause = FIRST_PAUSE
            return
        self._paused_for = self._pause
        self._pause = min(self._pause * 2, LONGEST_PAUSE)
        self.gain = 0.0  # after the pause, drafting gets a fresh chance
        self.length = self._first
