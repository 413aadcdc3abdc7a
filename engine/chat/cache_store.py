"""Keeps the KV caches of recent conversations under a memory budget (engine thread).

Bookkeeping only: the store never runs the model. A conversation's cache is
checked out while a reply uses it and cannot be evicted then; otherwise the least
recently used caches go first when the total exceeds the budget.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from engine.chat.generation import CachedSequence
from engine.host.memory import KV_CACHE_BUDGET_BYTES


class CacheStore:
    """Conversation id → ``CachedSequence``, least recently used first."""

    def __init__(self, new_cache: Callable[[], object], measure: Callable[[object], int], budget_bytes: int = KV_CACHE_BUDGET_BYTES) -> None:
        self._new_cache = new_cache
        self._measure = measure
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, CachedSequence] = OrderedDict()
        self._in_use: set[str] = set()

    def checkout(self, conversation_id: str) -> CachedSequence:
        """The conversation's cache (a new empty one if none is kept), marked in use."""
        seq = self._entries.pop(conversation_id, None) or CachedSequence(self._new_cache())
        self._entries[conversation_id] = seq  # most recently used goes last
        self._in_use.add(conversation_id)
        return seq

    def release(self, conversation_id: str) -> list[str]:
        """Done with it for now; evicts over-budget caches and returns the evicted ids."""
        self._in_use.discard(conversation_id)
        return self.evict_over_budget()

    def forget(self, conversation_id: str) -> None:
        if conversation_id not in self._in_use:
            self._entries.pop(conversation_id, None)

    def clear(self) -> None:
        """Drop every cache not in use (a new model makes them all meaningless)."""
        for conversation_id in [c for c in self._entries if c not in self._in_use]:
            del self._entries[conversation_id]

    def bytes_of(self, conversation_id: str) -> int:
        seq = self._entries.get(conversation_id)
        return self._measure(seq.kv) if seq else 0

    def total_bytes(self) -> int:
        return sum(self._measure(seq.kv) for seq in self._entries.values())

    def held_tokens(self, conversation_id: str) -> list[int]:
        seq = self._entries.get(conversation_id)
        return list(seq.token_ids) if seq else []

    def evict_over_budget(self) -> list[str]:
        evicted: list[str] = []
        for conversation_id in list(self._entries):
            if self.total_bytes() <= self.budget_bytes:
                break
            if conversation_id not in self._in_use:
                del self._entries[conversation_id]
                evicted.append(conversation_id)
        return evicted

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self._entries
