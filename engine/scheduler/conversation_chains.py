"""Which cached token runs each conversation left in the prefix index, so a deleted one's blocks can go (engine thread).

Bookkeeping only, like the rest of ``engine/scheduler``. The prefix index knows blocks
by their token ids, not by conversation: any prompt may reuse any conversation's
prefix. So each finished sequence's written tokens are remembered under its
conversation (a later turn's run replaces the runs it extends; an edited or regenerated
turn adds a branch). Forgetting a conversation takes the cached blocks of its runs out
of the index, except those another remembered conversation's runs pass through (a
common system prompt, say) and those a running sequence holds: they stay for reuse.
Runs are kept by token ids rather than block ids because an evicted block is reused
for other tokens; what is no longer cached simply matches nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from engine.scheduler.block_pool import BlockPool

BRANCHES_PER_CONVERSATION = 8  # the newest runs kept per conversation; older branches are left to eviction

TokenRun = tuple[int, ...]


@dataclass
class _Run:
    """A finished sequence's written tokens, and where the earlier runs it extends ended (their partial last
    blocks are cached too: the next turn copied their tokens instead of sharing those blocks)."""

    tokens: TokenRun
    ends: list[int] = field(default_factory=list)

    def covers(self, tokens: TokenRun) -> bool:
        return self.tokens[: len(tokens)] == tokens


class ConversationChains:
    """Conversation id → its remembered runs; at most ``limit`` conversations, least recently used dropped."""

    def __init__(self, pool: BlockPool, limit: int) -> None:
        self._pool = pool
        self._limit = max(1, limit)
        self._runs: OrderedDict[str, list[_Run]] = OrderedDict()

    def record(self, conversation_id: str, token_ids: Sequence[int]) -> None:
        """A sequence of the conversation finished with ``token_ids`` written (and now cached)."""
        tokens = tuple(token_ids)
        if not tokens:
            return
        runs = self._runs.pop(conversation_id, [])
        covering = next((run for run in runs if run.covers(tokens)), None)
        if covering is not None:
            covering.ends.append(len(tokens))
        else:
            extended = [run for run in runs if _Run(tokens).covers(run.tokens)]
            ends = sorted(end for run in extended for end in (*run.ends, len(run.tokens)))
            runs = [run for run in runs if run not in extended] + [_Run(tokens, ends)]
        self._runs[conversation_id] = runs[-BRANCHES_PER_CONVERSATION:]
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)

    def forget(self, conversation_id: str) -> int:
        """Uncache the conversation's blocks that nothing else needs; how many blocks that freed."""
        mine = self._cached_blocks(self._runs.pop(conversation_id, []))
        needed = self._cached_blocks([run for runs in self._runs.values() for run in runs])
        loose = [b for b in mine if b not in needed and self._pool.blocks[b].ref_count == 0]  # held: in use
        self._pool.forget(loose)
        return len(loose)

    def _cached_blocks(self, runs: list[_Run]) -> dict[int, None]:
        """The indexed blocks holding exactly these runs' tokens (as an ordered set)."""
        found: dict[int, None] = {}
        size = self._pool.block_size
        for run in runs:
            for end in (*run.ends, len(run.tokens)):
                match = self._pool.match(run.tokens[:end])
                found.update(dict.fromkeys(match.blocks))
                tail = run.tokens[len(match.blocks) * size : end]
                if match.partial is not None and self._pool.blocks[match.partial].tokens == tail:
                    found[match.partial] = None
        return found
