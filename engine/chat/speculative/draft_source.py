"""Where a request's drafts come from: one interface, chosen per request (engine thread).

The batch runner asks a ``DraftSource`` once per step for the drafts of every
decoding request that uses it (``DraftWant``: the sequence so far and how many
tokens), so a source that runs a model batches them. ``LookupDrafts`` drafts from
the conversation itself (``prompt_lookup``); the draft model's source lives with
the code that runs models (``engine/service/draft_model.py``). A source is told
when a request ends (``forget``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from engine.chat.speculative.draft_length import ROW_COST
from engine.chat.speculative.prompt_lookup import PromptLookup


@dataclass(frozen=True)
class DraftWant:
    """Up to ``count`` tokens to verify after ``tokens`` (request ``request_id``'s sequence so far, its last token not
    yet fed to the target)."""

    request_id: str
    tokens: Sequence[int]
    count: int


class DraftSource(Protocol):
    """Drafts for several requests at once."""

    row_cost: float
    """What a drafted token costs, in target decode steps: its row in the target's step and whatever drafting it
    took (``DraftLength`` pauses drafting when the accepted tokens stop paying for that)."""

    def drafts(self, wants: Sequence[DraftWant]) -> dict[str, list[int]]:
        """Each want's draft by request id (at most its ``count`` tokens; [] or absent for none)."""
        ...

    def forget(self, request_id: str) -> None:
        """The request ended: whatever the source kept for it goes."""
        ...


class LookupDrafts:
    """Drafts by prompt lookup: no model, nothing but the drafted row's cost (``row_cost``: the target's)."""

    def __init__(self, row_cost: float = ROW_COST) -> None:
        self.row_cost = row_cost
        self._lookups: dict[str, PromptLookup] = {}  # request id -> its sequence's n-grams

    def drafts(self, wants: Sequence[DraftWant]) -> dict[str, list[int]]:
        lookups = [self._lookups.setdefault(want.request_id, PromptLookup()) for want in wants]
        return {want.request_id: lookup.draft(want.tokens, want.count) for want, lookup in zip(wants, lookups)}

    def forget(self, request_id: str) -> None:
        self._lookups.pop(request_id, None)
