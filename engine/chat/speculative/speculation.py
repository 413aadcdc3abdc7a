"""One request's speculative drafting: where drafts come from, their length, and the counts (engine thread)."""

from __future__ import annotations

from typing import Sequence

from engine.chat.speculative.draft_length import DraftLength
from engine.chat.speculative.prompt_lookup import PromptLookup


class Speculation:
    """Drafts for one sequence and what became of them (``drafted``, ``accepted``)."""

    def __init__(self) -> None:
        self.lookup = PromptLookup()
        self.length = DraftLength()
        self.drafted = 0
        self.accepted = 0

    def draft(self, tokens: Sequence[int], room: int) -> list[int]:
        """Tokens to verify after ``tokens`` (the sequence so far, its last one not yet fed), at most ``room`` (what
        the reply and the context still take after the next token); [] for none this step."""
        count = min(self.length.next(), room)
        return self.lookup.draft(tokens, count) if count > 0 else []

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens was verified and its first ``accepted`` said."""
        self.drafted += drafted
        self.accepted += accepted
        self.length.record(drafted, accepted)
