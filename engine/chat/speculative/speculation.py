"""One request's speculative drafting: its draft source, its draft length, and the counts (engine thread)."""

from __future__ import annotations

from typing import Sequence

from engine.chat.speculative.draft_length import DraftLength
from engine.chat.speculative.draft_source import DraftSource, DraftWant


class Speculation:
    """Drafts for one sequence from ``source`` and what became of them (``drafted``, ``accepted``)."""

    def __init__(self, request_id: str, source: DraftSource) -> None:
        self.request_id = request_id
        self.source = source
        self.length = DraftLength(source.row_cost)
        self.drafted = 0
        self.accepted = 0

    def want(self, tokens: Sequence[int], room: int) -> DraftWant | None:
        """What to ask the source for after ``tokens`` (the sequence so far, its last one not yet fed), at most
        ``room`` tokens (what the reply and the context still take after the next token); None for no draft this
        step (drafting pauses, or no room)."""
        count = min(self.length.next(), room)
        return DraftWant(self.request_id, tokens, count) if count > 0 else None

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens was verified and its first ``accepted`` said."""
        self.drafted += drafted
        self.accepted += accepted
        self.length.record(drafted, accepted)
