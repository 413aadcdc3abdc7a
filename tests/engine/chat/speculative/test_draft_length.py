"""Drafts grow while kept whole, shrink after a rejection, and pause when drafting stops paying."""

from __future__ import annotations

from engine.chat.speculative.draft_length import FIRST_LENGTH, FIRST_PAUSE, MAX_LENGTH, ROW_COST, DraftLength


def test_kept_drafts_grow_to_the_longest_and_a_rejection_cuts_to_the_kept_run():
    length = DraftLength()
    for _ in range(4):
        drafted = length.next()
        length.record(drafted, drafted)
    assert length.next() == MAX_LENGTH
    length.record(MAX_LENGTH, 2)
    assert length.next() == 3


def test_drafts_that_keep_failing_pause_drafting_for_longer_each_time():
    length = DraftLength()
    pauses = []
    for _ in range(2):
        while length.next():
            length.record(FIRST_LENGTH, 0)
        paused = 1
        while not length.next():
            paused += 1
        pauses.append(paused)
    assert pauses == [FIRST_PAUSE, 2 * FIRST_PAUSE]


def test_drafts_that_pay_never_pause():
    length = DraftLength()
    for _ in range(200):
        drafted = length.next()
        assert drafted > 0
        length.record(drafted, 1)  # one token of each draft kept: a step saved for a few rows


def test_a_costlier_drafted_row_starts_with_a_shorter_draft_and_still_grows():
    """A mixture of experts' drafted row (gpt-oss's costs about 0.85 of a step) first drafts what FIRST_LENGTH rows
    cost at ROW_COST, and after a pause starts there again."""
    length = DraftLength(row_cost=4 * ROW_COST)
    assert length.next() == FIRST_LENGTH // 4
    length.record(1, 1)
    assert length.next() == 2  # kept whole: it doubles
    length.record(2, 0)  # a rejected draft: a pause, then the short first draft again
    while not length.next():
        pass
    assert length.next() == FIRST_LENGTH // 4
