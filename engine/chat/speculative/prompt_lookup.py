"""Drafts from the conversation itself: prompt lookup (engine thread).

A reply that rewrites, summarises or edits a pasted text repeats long runs of it.
``PromptLookup`` indexes every n-gram (``MIN_NGRAM`` … ``MAX_NGRAM`` tokens) of a
sequence's tokens as they grow, and drafts the tokens that followed the latest
earlier occurrence of the sequence's last n tokens, the longest n that occurred.
"""

from __future__ import annotations

from typing import Sequence

MIN_NGRAM = 2
MAX_NGRAM = 4


class PromptLookup:
    """The n-grams of one growing token sequence (prompt, then reply), each with where it last ended."""

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> None:
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> the index just past its latest occurrence
        self._indexed = 0  # n-grams ending before this index are in ``_ends``

    def draft(self, tokens: Sequence[int], count: int) -> list[int]:
        """Up to ``count`` tokens that followed the latest earlier occurrence of ``tokens``' last n-gram (longest
        first); [] when none occurred. ``tokens`` only ever grows between calls."""
        self._index(tokens, len(tokens) - 1)  # every n-gram but the suffix itself
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            end = self._ends.get(tuple(tokens[len(tokens) - size :]))
            if end is not None:
                return list(tokens[end : end + count])
        return []

    def _index(self, tokens: Sequence[int], until: int) -> None:
        """Record the n-grams ending at indices ``_indexed`` … ``until`` - 1 (exclusive ends up to ``until``)."""
        for end in range(max(self._indexed, self.min_ngram), until + 1):
            for size in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._ends[tuple(tokens[end - size : end])] = end
        self._indexed = max(self._indexed, until + 1)
