"""Drafts grow while kept whole, shrink after a rejection, and pause when drafting stops paying."""

from __future__ import annotations

from engine.chat.speculative.draft_length import FIRST_LENGTH, FIRST_PAUSE, MAX_LENGTH, DraftLength


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
