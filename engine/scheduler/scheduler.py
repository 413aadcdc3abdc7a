"""Continuous batching: which tokens of which sequences each forward step computes (engine thread).

Bookkeeping only; the runtime runs each planned ``Step`` and reports back. One step
is one forward pass over every running sequence: a sequence still holding several
uncomputed tokens (a prompt, or a recompute after preemption) gets a chunk of them
from the step's token budget, after every decoding sequence has had its one token,
so a long prompt is prefilled a chunk at a time while running streams keep flowing
(with nothing decoding, a step takes bigger chunks).
Between steps new requests join (admission needs free blocks for the whole prompt,
after its cached prefix is matched, beside what the prompts already running still
need; each chunk then takes the blocks it fills, so blocks held are the positions
written and at most one partly filled block per sequence; a request whose prefix another sequence is still
prefilling waits for it, so eight chats arriving with one system prompt compute it
once) and finished or cancelled ones leave. When a
decoding sequence needs a block and none is free, the most recently admitted running
sequence is preempted: its blocks go back to the pool (its full ones stay cached)
and it waits at the head of the queue to be recomputed. Nothing is ever allocated
beyond the pool, so running short means waiting, never running out of memory.

A model with several KV groups (``engine/forward/windows.py``: sliding-window layers
beside full ones) gives each sequence a block table per group, all from the one pool.
Group 0's table carries the prefix index; the others' blocks are indexed as its
shadows. A window group's blocks that fall wholly before the window of the next
position are let go after each step (their table entries become ``RELEASED``), so
such a group holds about a window per sequence whatever its length, and a model whose
layers all have windows runs conversations longer than the pool. A cached prefix is
reused as far as every group still holds what the next position sees: for a window
group, the shadows of its last window; else up to an earlier block where they are
there, or not at all.

A decoding sequence may carry a speculative draft (``propose``, ``engine/chat/speculative``):
its chunk then feeds the drafted tokens after its last one, taking blocks for them
from the step's budget and the free blocks (a draft is cut short where either runs
out). The step writes their keys and values, but ``complete`` counts only the last
token as computed; ``keep_drafted`` then counts the accepted ones, and the blocks
past what the sequence now needs go back to the pool. Positions past ``computed``
are never indexed nor read, so a rejected token's keys and values are simply
overwritten by the next step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.forward.windows import window_start
from engine.scheduler.block_pool import ROOT, BlockPool, PrefixMatch, common_prefix_length
from engine.scheduler.step_pacer import StepPacer

DEFAULT_STEP_TOKENS = 40
"""Tokens per step while some sequence decodes, until the pacer (``step_pacer``) has seen what steps cost: it bounds
their inter-token time while a prompt joins. A larger budget lets the streams' slowest gaps grow well past their
median; this one keeps them close without delaying the joining prompt's first token much."""
IDLE_STEP_TOKENS = 512  # per step while none does: a lone prompt is prefilled in big chunks, where big matmuls pay
DEFAULT_MAX_RUNNING = 16
RELEASED = -1  # a window group's table entry whose block was let go: no position the sequence reads lies there


@dataclass
class SequenceState:
    """One request's tokens (prompt, then each sampled token once it is to be fed) and the blocks holding them."""

    request_id: str
    token_ids: list[int]
    blocks: list[int] = field(default_factory=list)  # KV group 0's table
    group_tables: list[list[int]] = field(default_factory=list)  # groups 1 …'s (``Scheduler.windows``)
    computed: int = 0  # leading positions whose keys and values are written
    reused: int = -1  # positions found in the cache at the first admission (-1 until admitted)
    indexed: int = 0  # leading blocks in the prefix index
    index_node: int = ROOT  # the index node of the last of those
    written_from: int = 0  # the first block this sequence wrote itself
    draft: list[int] = field(default_factory=list)  # speculative tokens to feed after the last one at the next step

    @property
    def pending(self) -> int:
        return len(self.token_ids) - self.computed

    @property
    def tables(self) -> list[list[int]]:
        return [self.blocks, *self.group_tables]

    def held_blocks(self) -> list[int]:
        """Every block the sequence holds, table by table."""
        return [block for table in self.tables for block in table if block != RELEASED]


@dataclass(frozen=True)
class ScheduledChunk:
    """Feed ``token_ids`` at positions ``start…`` of a sequence whose blocks are ``block_ids``.

    ``samples``: the chunk ends at the sequence's last token, so its logits pick the next one. ``group_tables``:
    KV groups 1 …'s tables, where the model has several. ``drafted``: how many of ``token_ids``' last tokens are a
    speculative draft (their logits are each needed, as is the last real token's).
    """

    request_id: str
    token_ids: tuple[int, ...]
    start: int
    block_ids: tuple[int, ...]
    samples: bool
    group_tables: tuple[tuple[int, ...], ...] = ()
    drafted: int = 0


@dataclass(frozen=True)
class BlockCopy:
    """Before the step: copy the first ``tokens`` positions of block ``source`` into block ``target``."""

    source: int
    target: int
    tokens: int


@dataclass(frozen=True)
class Step:
    chunks: tuple[ScheduledChunk, ...]
    copies: tuple[BlockCopy, ...] = ()
    admitted: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()  # (request id, why it can never fit)


class Scheduler:
    """Waiting and running sequences over one ``BlockPool``."""

    def __init__(self, pool: BlockPool, step_tokens: int = DEFAULT_STEP_TOKENS, max_running: int = DEFAULT_MAX_RUNNING,
                 idle_step_tokens: int = IDLE_STEP_TOKENS, pacer: StepPacer | None = None,
                 windows: tuple[int | None, ...] = (None,)) -> None:
        """``pacer``: sizes the prompt tokens of a step with decoding rows from what steps cost (``step_pacer``);
        ``step_tokens`` is the budget until it knows, or throughout without one. ``windows``: each KV group's
        window (``KVGroups.windows``; None: full attention)."""
        self.pool = pool
        self.windows = windows
        self.pacer = pacer
        self.step_tokens = max(step_tokens, max_running)
        self.idle_step_tokens = max(idle_step_tokens, self.step_tokens)
        self.max_running = max_running
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self._copy_sources: list[int] = []

    def add(self, request_id: str, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("A request needs at least one prompt token.")
        self.waiting.append(SequenceState(request_id, list(prompt_ids), group_tables=[[] for _ in self.windows[1:]]))

    def get(self, request_id: str) -> SequenceState | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> Step:
        """Plan the next step: grow decoding sequences (preempting if short), admit waiting ones, hand out tokens
        (each chunk's blocks taken as it is planned)."""
        preempted = self._grow_running()
        admitted, copies, rejected = self._admit()
        chunks = self._chunks()
        while not chunks and self.running and not copies:  # every prompt short of blocks, none decoding: make room
            preempted.append(self._preempt(self.running[-1]))
            chunks = self._chunks()
        return Step(chunks, tuple(copies), tuple(admitted), tuple(preempted), tuple(rejected))

    def complete(self, step: Step) -> None:
        """The step ran: its positions are written (a draft's only once kept, ``keep_drafted``); newly full blocks
        enter the prefix index."""
        for chunk in step.chunks:
            seq = self.get(chunk.request_id)
            if seq is not None:
                seq.computed = chunk.start + len(chunk.token_ids) - chunk.drafted
                seq.draft = []
                self._index_full_blocks(seq)
                self._release_before_windows(seq)
        self.pool.release(self._copy_sources)
        self._copy_sources = []

    def propose(self, request_id: str, draft: list[int]) -> None:
        """Speculative tokens for a decoding sequence to feed after its last one at the next step (as many as the
        step's budget and the free blocks allow)."""
        seq = self.get(request_id)
        assert seq is not None and seq.pending == 1, f"{request_id} is not decoding"
        seq.draft = list(draft)

    def keep_drafted(self, request_id: str, token_ids: list[int]) -> None:
        """The first drafted tokens of the step just completed were said: their positions count as computed; the
        blocks past the next position go back to the pool."""
        seq = self.get(request_id)
        assert seq is not None, f"no sequence {request_id}"
        seq.token_ids += token_ids
        seq.computed += len(token_ids)
        self._index_full_blocks(seq)
        self._release_before_windows(seq)
        needed = self._blocks_for(seq.computed + 1)
        for table in seq.tables:
            self.pool.release(table[needed:])
            del table[needed:]

    def follow(self, request_id: str, token_ids: list[int]) -> bool:
        """The sequence goes on as ``token_ids`` (a draft model's sequence following its target's): True when what it
        computed is their prefix, its tokens past that now pending; False (nothing changed) when it has no such
        sequence or computed other tokens."""
        seq = self.get(request_id)
        if seq is None or len(token_ids) <= seq.computed or token_ids[: seq.computed] != seq.token_ids[: seq.computed]:
            return False
        seq.token_ids = list(token_ids)
        return True

    def append(self, request_id: str, token_id: int) -> None:
        """A sampled token the sequence goes on with: the next step feeds it."""
        seq = self.get(request_id)
        assert seq is not None, f"no sequence {request_id}"
        seq.token_ids.append(token_id)

    def finish(self, request_id: str) -> None:
        """The sequence is done (or cancelled): its blocks go back, its partial last block cached too."""
        seq = self._remove(request_id)
        if seq is None or not seq.blocks:
            return
        self._index_full_blocks(seq)
        tail = seq.token_ids[seq.indexed * self.pool.block_size : seq.computed]
        if tail and seq.indexed < len(seq.blocks):
            self._index_block(seq, self.pool.index(seq.index_node, tail, seq.blocks[seq.indexed]))
        self._release(seq)

    def abort(self, request_id: str) -> None:
        """The sequence failed mid-step: what it wrote may be half done, so none of it is kept."""
        seq = self._remove(request_id)
        if seq is not None and seq.blocks:
            self.pool.forget([b for table in seq.tables for b in table[seq.written_from :] if b != RELEASED])
            self._release(seq)

    def held_tokens(self) -> int:
        """Positions written in blocks that running sequences hold, each shared block counted once."""
        filled: dict[int, int] = {}
        size = self.pool.block_size
        for seq in self.running:
            for table in seq.tables:
                for index, block_id in enumerate(table):
                    held = min(size, max(seq.computed - index * size, 0))
                    filled[block_id] = max(filled.get(block_id, 0), held)
        filled.pop(RELEASED, None)
        return sum(filled.values())

    # ------------------------------------------------------------ planning

    def _grow_running(self) -> list[str]:
        """A block more for each decoding sequence whose next token starts one (prompts grow chunk by chunk)."""
        preempted: list[str] = []
        for seq in list(self.running):
            if seq not in self.running or seq.pending != 1:
                continue  # preempted for an earlier one, or still prefilling
            while seq in self.running and not self._extend(seq, len(seq.token_ids)):
                preempted.append(self._preempt(self.running[-1]))
        return preempted

    def _extend(self, seq: SequenceState, positions: int) -> bool:
        """Blocks for positions up to ``positions`` in every table of ``seq``: taken (True) or, short of them,
        none taken (False)."""
        missing = self._blocks_for(positions) - len(seq.blocks)
        if missing <= 0:
            return True
        if missing * len(seq.tables) > self.pool.free_blocks:
            return False
        for table in seq.tables:
            table += self.pool.allocate(missing, _last(table))
        return True

    def _release(self, seq: SequenceState) -> None:
        """Let go of every block ``seq`` holds (a chain's tail before its head)."""
        for table in seq.tables:
            self.pool.release([block for block in table if block != RELEASED])

    def _release_before_windows(self, seq: SequenceState) -> None:
        """Let go of each window group's blocks that hold no position the next query (at ``computed``) sees."""
        for table, window in zip(seq.tables, self.windows):
            gone = min(window_start(seq.computed, window) // self.pool.block_size, len(table))
            self.pool.release([block for block in table[:gone] if block != RELEASED])
            table[:gone] = [RELEASED] * gone

    def _preempt(self, seq: SequenceState) -> str:
        self._index_full_blocks(seq)
        self._release(seq)
        self.running.remove(seq)
        seq.blocks, seq.computed, seq.indexed, seq.index_node, seq.draft = [], 0, 0, ROOT, []
        seq.group_tables = [[] for _ in self.windows[1:]]
        self.waiting.appendleft(seq)
        return seq.request_id

    def _admit(self) -> tuple[list[str], list[BlockCopy], list[tuple[str, str]]]:
        admitted: list[str] = []
        copies: list[BlockCopy] = []
        rejected: list[tuple[str, str]] = []
        for seq in list(self.waiting):
            if len(self.running) >= self.max_running:
                break
            if self._most_held(len(seq.token_ids)) > self.pool.num_blocks:
                self.waiting.remove(seq)
                rejected.append((seq.request_id, self._too_long(seq)))
                continue
            if self._shares_a_prefill(seq):
                continue  # its prefix is being computed: it waits to reuse it rather than compute it again
            placed_copies, placed = self._try_place(seq)
            if not placed:
                break  # first come, first served: the queue waits for blocks
            self.waiting.remove(seq)
            self.running.append(seq)
            admitted.append(seq.request_id)
            copies += placed_copies
        return admitted, copies, rejected

    def _shares_a_prefill(self, seq: SequenceState) -> bool:
        """Whether a running sequence still prefilling holds a full block more of ``seq``'s prefix than the index does."""
        size = self.pool.block_size
        cached = len(self.pool.match(seq.token_ids[:-1]).blocks) * size
        return any(
            other.pending > 1 and common_prefix_length(other.token_ids, seq.token_ids[:-1]) >= cached + size
            for other in self.running
        )

    def _try_place(self, seq: SequenceState) -> tuple[list[BlockCopy], bool]:
        """Give ``seq`` its cached prefix (``False`` when the pool cannot yet hold the rest beside the prompts
        already running), and the blocks and copies that complete a partly shared one (one per KV group)."""
        size = self.pool.block_size
        match = self.pool.match(seq.token_ids[:-1])  # at least one token is computed: its logits start the reply
        full, tables, partials = self._reusable(match)
        computed = full * size + (match.partial_tokens if partials else 0)
        held = [*(block for table in tables for block in table if block != RELEASED), *partials]
        self.pool.acquire(held)
        needed = sum(self._still_needed(len(seq.token_ids), full, window) for window in self.windows)
        fresh = self._one_more_block(tables) if partials else []
        if fresh is None or self.pool.free_blocks + len(fresh) < needed + self._promised():
            self.pool.release([*held, *(fresh or [])])
            return [], False
        for table, block in zip(tables, fresh):
            table.append(block)
        seq.blocks, seq.group_tables = tables[0], tables[1:]
        seq.computed = computed
        seq.indexed, seq.index_node, seq.written_from = full, match.blocks[full - 1] if full else ROOT, full
        seq.reused = seq.computed if seq.reused < 0 else seq.reused
        self._copy_sources += partials
        return [BlockCopy(source, target, match.partial_tokens) for source, target in zip(partials, fresh)], True

    def _one_more_block(self, tables: list[list[int]]) -> list[int] | None:
        """A block for each table, right after its last where the pool allows; None (none taken) if short."""
        if len(tables) > self.pool.free_blocks:
            return None
        return [self.pool.allocate(1, _last(table))[0] for table in tables]

    def _reusable(self, match: PrefixMatch) -> tuple[int, list[list[int]], list[int]]:
        """How much of ``match`` every KV group can reuse: its full blocks taken, each group's table of them (its
        blocks before the window of the next position ``RELEASED``), and each group's block whose first tokens
        are copied (none: the partial block is not reused). The longest reuse whose shadows are all cached: the
        whole match, else without its partial block, else a block shorter at a time."""
        count = len(match.blocks)
        tries = [(count, True)] if match.partial is not None else []
        for full, partial in tries + [(full, False) for full in range(count, 0, -1)]:
            end = full * self.pool.block_size + (match.partial_tokens if partial else 0)
            partials = [self._shadow(match.partial, group) for group in range(len(self.windows))] if partial else []
            if RELEASED not in partials and all(self._cached_window(match.blocks[:full], group, window, end)
                                                for group, window in enumerate(self.windows)):
                tables = [self._reused_table(match.blocks[:full], group, window, end)
                          for group, window in enumerate(self.windows)]
                return full, tables, partials
        return 0, [[] for _ in self.windows], []  # nothing cached is usable: the prompt is computed whole

    def _cached_window(self, nodes: tuple[int, ...], group: int, window: int | None, end: int) -> bool:
        """Whether group ``group`` holds, beside the cached blocks ``nodes``, what the position ``end`` sees."""
        first = window_start(end, window) // self.pool.block_size
        return all(self._shadow(node, group) != RELEASED for node in nodes[first:])

    def _reused_table(self, nodes: tuple[int, ...], group: int, window: int | None, end: int) -> list[int]:
        """Group ``group``'s table for the cached blocks ``nodes`` (group 0's), the next position at ``end``:
        ``RELEASED`` before the window's first block (``_cached_window`` says the rest are there)."""
        first = window_start(end, window) // self.pool.block_size
        return [RELEASED if index < first else self._shadow(node, group) for index, node in enumerate(nodes)]

    def _shadow(self, node: int, group: int) -> int:
        """Group ``group``'s block beside group 0's cached ``node``: the node itself for group 0."""
        if group == 0:
            return node
        shadow = self.pool.shadow(node, group)
        return RELEASED if shadow is None else shadow

    def _promised(self) -> int:
        """Blocks the running prompts still need to finish: admission leaves them free."""
        return sum(self._still_needed(len(seq.token_ids), len(seq.blocks), window)
                   for seq in self.running for window in self.windows)

    def _still_needed(self, positions: int, held: int, window: int | None) -> int:
        """Blocks a table of ``window`` holding ``held`` blocks takes before its sequence reaches ``positions``:
        a window group's at most its window's (it lets go of earlier ones as it goes, and its prompt's chunks
        shrink to the blocks free)."""
        missing = max(self._blocks_for(positions) - held, 0)
        return missing if window is None else min(missing, self._blocks_for(window) + 1)

    def _most_held(self, positions: int) -> int:
        """The most blocks a sequence of ``positions`` holds at once, every table counted."""
        return sum(self._still_needed(positions, 0, window) for window in self.windows)

    def _chunks(self) -> tuple[ScheduledChunk, ...]:
        budget = self._step_budget()
        chunks: dict[str, ScheduledChunk] = {}
        for seq in sorted(self.running, key=lambda s: s.pending > 1):  # decoding sequences first
            count = self._held_for(seq, min(seq.pending + len(seq.draft), budget))
            if count <= 0:
                continue
            budget -= count
            tokens = tuple([*seq.token_ids, *seq.draft][seq.computed : seq.computed + count])
            drafted = max(count - seq.pending, 0)
            samples = seq.computed + count - drafted == len(seq.token_ids)
            chunks[seq.request_id] = ScheduledChunk(seq.request_id, tokens, seq.computed, tuple(seq.blocks), samples,
                                                    tuple(tuple(table) for table in seq.group_tables), drafted)
        return tuple(chunks[s.request_id] for s in self.running if s.request_id in chunks)

    def _step_budget(self) -> int:
        """Tokens for the next step: the idle budget with nothing decoding, else a token per decoding row and what
        the pacer allows the prompts (the fixed budget until it knows)."""
        decoding = sum(seq.pending == 1 for seq in self.running)
        if not decoding:
            return self.idle_step_tokens
        drafted = sum(len(seq.draft) for seq in self.running)
        paced = self.pacer.prompt_tokens(decoding) if self.pacer else None
        return drafted + (self.step_tokens if paced is None else decoding + paced)

    def _held_for(self, seq: SequenceState, count: int) -> int:
        """``count`` tokens, or as many as its blocks can hold once it takes the blocks they need, or those free."""
        room = self.pool.free_blocks // len(seq.tables)  # blocks each of its tables may take
        size = self.pool.block_size
        self._extend(seq, min(seq.computed + count, (len(seq.blocks) + room) * size))
        return min(count, len(seq.blocks) * size - seq.computed)

    # ------------------------------------------------------------ helpers

    def _index_full_blocks(self, seq: SequenceState) -> None:
        size = self.pool.block_size
        while (seq.indexed + 1) * size <= seq.computed and seq.indexed < len(seq.blocks):
            tokens = seq.token_ids[seq.indexed * size : (seq.indexed + 1) * size]
            seq.index_node = self.pool.index(seq.index_node, tokens, seq.blocks[seq.indexed])
            self._index_block(seq, seq.index_node)
            seq.indexed += 1

    def _index_block(self, seq: SequenceState, node: int) -> None:
        """The other groups' blocks at ``seq.indexed``, where still held, as shadows of group 0's ``node``."""
        for group, table in enumerate(seq.group_tables, start=1):
            block = table[seq.indexed]
            if block != RELEASED and not self.pool.blocks[block].indexed:
                self.pool.index_shadow(node, group, block)

    def _remove(self, request_id: str) -> SequenceState | None:
        seq = self.get(request_id)
        if seq in self.running:
            self.running.remove(seq)
        elif seq is not None:
            self.waiting.remove(seq)
        return seq

    def _blocks_for(self, positions: int) -> int:
        return -(-positions // self.pool.block_size)

    def _too_long(self, seq: SequenceState) -> str:
        pool = self.pool
        return (f"This request needs {len(seq.token_ids)} positions of KV cache, but the whole pool holds "
                f"{pool.num_blocks * pool.block_size}. A shorter conversation or a larger memory budget fits.")


def _last(table: list[int]) -> int | None:
    """The table's last block, where the next one is best taken after (``BlockPool.allocate``)."""
    return table[-1] if table and table[-1] != RELEASED else None
