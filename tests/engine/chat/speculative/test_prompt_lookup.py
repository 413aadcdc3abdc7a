"""Prompt lookup drafts what followed the conversation's latest earlier occurrence of its last tokens."""

from __future__ import annotations

from engine.chat.speculative.prompt_lookup import PromptLookup


def test_drafts_what_followed_the_last_ngram_where_it_occurred_before():
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 2, 3]
    assert PromptLookup().draft(tokens, 3) == [4, 5, 6]


def test_prefers_the_longest_ngram_then_the_latest_occurrence():
    tokens = [7, 2, 3, 50, 8, 2, 3, 60, 9, 7, 2, 3]
    assert PromptLookup().draft(tokens, 2) == [50, 8]  # [7, 2, 3] occurred once, before 50; [2, 3] last before 60
    assert PromptLookup().draft([*tokens[:-3], 2, 3], 2) == [60, 9]


def test_no_draft_without_an_earlier_occurrence_or_past_the_end():
    assert PromptLookup().draft([1, 2, 3, 4], 4) == []
    assert PromptLookup().draft([5, 6, 5, 6], 4) == [5, 6]  # what follows runs up to the end of the tokens


def test_a_growing_sequence_finds_ngrams_said_since_the_last_draft():
    lookup = PromptLookup()
    tokens = [1, 2, 3, 4]
    assert lookup.draft(tokens, 2) == []
    tokens += [8, 1, 2]
    assert lookup.draft(tokens, 2) == [3, 4]
    tokens += [3, 4, 8]
    assert lookup.draft(tokens, 3) == [1, 2, 3]
