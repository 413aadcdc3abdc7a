"""The KV blocks of one loaded model, their ref counts and the prefix index (engine thread).

Bookkeeping only: block ``b`` stands for positions ``b * block_size …`` of the KV
storage the forward pass owns (``engine/forward/paged_kv.py``).

The prefix index is a tree of blocks keyed by exact token ids, as SGLang's radix
cache is, at block granularity: a block's key is its parent block and the token ids it
holds. It was chosen over vLLM's chained hashes of full blocks because a chat needs
token-exact reuse: an edited or regenerated turn diverges inside a block, and the tree
finds the cached block that shares the longest run of tokens there (full or partial,
such as the last block of a finished reply), whose first tokens the new sequence then
copies (copy on write) instead of recomputing. Exact keys also rule out hash
collisions. Full blocks are indexed as soon as they fill; a sequence's partial last
block when it finishes.

A block is free when no sequence holds it (ref count 0). Free blocks wait in one queue
in eviction order: blocks holding nothing go first, then indexed ones least recently
used first. Allocating prefers empty blocks in one run after the sequence's last block
(so the forward pass reads a sequence's keys in place), then takes the head; taking an
indexed block evicts it with its descendants, which no sequence can hold either (a
sequence holds the whole chain). A block in use is never evicted.

A model whose layers form several KV groups (``engine/forward/windows.py``) holds a
block of each group per block of a sequence. The index keys group 0's blocks by
tokens; another group's block hangs under group 0's indexed block of the same
positions as its shadow (``index_shadow``), so it is found, and evicted, with it. A
window group lets go of its blocks before the window while later ones are still
held: taking a block for reuse therefore also drops whatever still hangs under it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

BLOCK_SIZE = 16
"""Positions a block holds, in every pool the engine makes (the model's and its draft model's)."""
ROOT = -1  # the parent of every sequence's first block

TokenKey = tuple[int, ...]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    parent: int = ROOT
    tokens: TokenKey = ()  # the token ids it holds, while indexed
    indexed: bool = False


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks for a prompt's first ``len(blocks) * block_size + partial_tokens`` tokens.

    ``partial`` is a cached block whose first ``partial_tokens`` tokens come next: they are
    copied into a block of the sequence's own, since the rest of that block differs.
    """

    blocks: tuple[int, ...]
    partial: int | None
    partial_tokens: int
    parent: int  # the index node the next full block of this prompt would hang under


@dataclass
class BlockPool:
    """``num_blocks`` blocks of ``block_size`` positions each."""

    num_blocks: int
    block_size: int
    blocks: list[Block] = field(init=False)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"A KV pool needs at least one block of one position, not {self.num_blocks} × {self.block_size}.")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(self.num_blocks))
        self._children: dict[int, dict[TokenKey, int]] = {}

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds: free, or cached and evictable."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence holds (cheap: every other block waits in the free queue)."""
        return self.num_blocks - len(self._free)

    def allocate(self, count: int, after: int | None = None) -> list[int] | None:
        """``count`` blocks held once each, evicting cached ones as needed; ``None`` (and nothing taken) if short.

        The blocks come in one run where the pool allows: right after block ``after`` (the
        sequence's last), else from the middle of the longest run of empty blocks, which
        leaves room on both sides for the sequences beside it to grow into. A sequence
        whose blocks follow one another is read in place by the forward pass, not gathered.
        """
        if count > len(self._free):
            return None
        run = self._empty_run(after + 1, count) if after is not None else []
        run = run or self._empty_run(self._roomiest_start(), count)
        for block_id in run:
            del self._free[block_id]
        taken = run + [self._free.popitem(last=False)[0] for _ in range(count - len(run))]
        for block_id in taken:
            self._unindex(block_id)  # indexed, or the parent of blocks indexed after it was evicted
            self.blocks[block_id].ref_count = 1
        return taken

    def _is_empty(self, block_id: int) -> bool:
        """Free and holding nothing cached (taking it evicts nothing)."""
        return block_id in self._free and not self.blocks[block_id].indexed

    def _empty_run(self, start: int, count: int) -> list[int]:
        """Up to ``count`` empty blocks from ``start`` on, one after another."""
        run = []
        for block_id in range(start, min(start + count, self.num_blocks)):
            if not self._is_empty(block_id):
                break
            run.append(block_id)
        return run

    def _roomiest_start(self) -> int:
        """The middle of the longest run of empty blocks (its start when it begins the pool)."""
        best_start, best_length, start = 0, 0, None
        for block_id in range(self.num_blocks + 1):
            if block_id < self.num_blocks and self._is_empty(block_id):
                start = block_id if start is None else start
                continue
            if start is not None and block_id - start > best_length:
                best_start, best_length = start, block_id - start
            start = None
        return best_start if best_start == 0 else best_start + best_length // 2

    def acquire(self, block_ids: Sequence[int]) -> None:
        """Hold cached blocks (a matched prefix) once more; they leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1

    def release(self, block_ids: Sequence[int]) -> None:
        """Let go of blocks, last first: a chain's tail is evicted before its head."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} released more often than held"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                self._free.move_to_end(block_id, last=block.indexed)

    def index(self, parent: int, tokens: Sequence[int], block_id: int) -> int:
        """Record that ``block_id`` holds ``tokens`` after ``parent``; returns the index node now standing for them
        (an identical block indexed before keeps its place, and ``block_id`` stays unindexed)."""
        key = tuple(tokens)
        siblings = self._children.setdefault(parent, {})
        if key in siblings:
            return siblings[key]
        block = self.blocks[block_id]
        assert not block.indexed, f"block {block_id} is indexed already"
        block.parent, block.tokens, block.indexed = parent, key, True
        siblings[key] = block_id
        return block_id

    def index_shadow(self, block_id: int, group: int, shadow: int) -> None:
        """Record that ``shadow`` holds KV group ``group``'s keys of the positions of indexed ``block_id`` (an
        earlier shadow there keeps its place)."""
        self.index(block_id, _shadow_key(group), shadow)

    def shadow(self, block_id: int, group: int) -> int | None:
        """The cached block of KV group ``group`` beside indexed ``block_id`` (``index_shadow``), if any."""
        return self._children.get(block_id, {}).get(_shadow_key(group))

    def forget(self, block_ids: Sequence[int]) -> None:
        """Take blocks (and what hangs under them) out of the index: their contents are not to be trusted."""
        for block_id in block_ids:
            if self.blocks[block_id].indexed:
                self._unindex(block_id)

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of ``token_ids`` (the blocks are not held: ``acquire`` them)."""
        size, node, blocks = self.block_size, ROOT, []
        position = 0
        while position + size <= len(token_ids):
            child = self._children.get(node, {}).get(tuple(token_ids[position : position + size]))
            if child is None:
                break
            blocks.append(child)
            node, position = child, position + size
        partial, shared = self._longest_child_run(node, token_ids[position : position + size])
        return PrefixMatch(tuple(blocks), partial, shared, node)

    def _longest_child_run(self, node: int, tokens: Sequence[int]) -> tuple[int | None, int]:
        best, best_length = None, 0
        for key, child in self._children.get(node, {}).items():
            length = common_prefix_length(key, tokens)
            if length > best_length:
                best, best_length = child, length
        return best, best_length

    def _unindex(self, block_id: int) -> None:
        block = self.blocks[block_id]
        self._children.get(block.parent, {}).pop(block.tokens, None)  # gone already when its parent goes first
        block.indexed, block.tokens, block.parent = False, (), ROOT
        for child in list(self._children.pop(block_id, {}).values()):
            self._unindex(child)
        if block.ref_count == 0 and block_id in self._free:
            self._free.move_to_end(block_id, last=False)  # holds nothing now: reused first

    def counts(self) -> tuple[int, int, int]:
        """Blocks in use, shared by several sequences, and cached with no sequence holding them (a scan of all)."""
        used = shared = cached = 0
        for block in self.blocks:
            if block.ref_count:
                used += 1
                shared += block.ref_count > 1
            else:
                cached += block.indexed
        return used, shared, cached


def _shadow_key(group: int) -> TokenKey:
    """A shadow's key among a block's children: no token id is negative, so no prompt ever matches it."""
    return (-group,)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return index
    return size
