"""A draft model beside the target: used only where it can draft for it, and its memory said (loader thread).

A draft model proposes token ids that the target verifies, so both must mean the
same thing by every id: the same tokens under the same ids, the same special tokens.
Both must also run on Hearth's fast path, whose batched steps the drafting uses
(``engine/service/draft_model.py``); a model on the transformers fallback loads no
draft model at all. A draft model that fails either check, or fails
to load, is dropped: the target loads all the same, and its load notice says why no
draft model is on. The draft model's KV pool holds ``DRAFT_POOL_CONTEXTS`` of the
shorter of the two contexts (``draft_pool_blocks``, which the pool and the notice both size from); the notice
counts its weights and that pool. Before either model loads, ``draft_need`` estimates the same two figures from the
draft model's headers, for the load dialog's estimate and the check that the model fits beside its draft model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.forward.backend import HFBackend
from engine.forward.kv_layout import kv_row_bytes
from engine.forward.windows import KVGroups
from engine.models.context_choice import DEFAULT_CONTEXT_CAP, choose_load
from engine.models.format_plan import formats_for_source, reads_fast
from engine.models.loading import LoadedModel
from engine.models.memory_estimate import config_windows, estimate_formats, gib_text, model_shape
from engine.models.model_source import ModelSource
from engine.scheduler.block_pool import BLOCK_SIZE

DRAFT_POOL_CONTEXTS = 2
"""The draft pool's positions, in contexts: drafting sequences hold about what their target sequences hold, and a
sequence it cannot place just goes without drafts until there is room."""


def draft_pool_blocks(context_length: int, block_size: int, groups: int) -> int:
    """Blocks of the draft model's KV pool for drafting sequences of ``context_length`` positions (the shorter of the
    two models' contexts): ``DRAFT_POOL_CONTEXTS`` contexts in whole blocks of ``block_size``, a block of each of the
    ``groups`` KV groups per block of context (a window group's too, which makes the pool ample there)."""
    return DRAFT_POOL_CONTEXTS * -(-context_length // block_size) * groups


@dataclass(frozen=True)
class DraftNeed:
    """The memory a draft model holds beside the model, in bytes: its weights and its KV pool."""

    weight_bytes: int = 0
    kv_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


NO_DRAFT = DraftNeed()


def draft_need(draft: ModelSource, target: ModelSource, asked_context: int | None, device: str,
               available_bytes: int) -> DraftNeed:
    """What ``draft`` would hold drafting for ``target`` on ``device``, from their headers: its weights in the formats
    its own load would take (``auto``, as ``model_open`` loads it) and its pool for the longest context the target's
    load may take (``asked_context``, else up to ``DEFAULT_CONTEXT_CAP``); nothing for a target the fast path does not
    read, which takes no draft model (``target_refused``). Raises ``NotEnoughMemoryError`` when ``draft`` would not
    load at all in ``available_bytes``."""
    if not reads_fast(target):
        return NO_DRAFT
    precision, context = choose_load(draft, device, "auto", None, available_bytes)
    formats = formats_for_source(draft, device, precision)
    target_context = asked_context or min(DEFAULT_CONTEXT_CAP, target.native_context)
    pool = _pool_bytes(draft.config, formats.kv_cache, min(target_context, context.tokens))
    return DraftNeed(estimate_formats(draft, formats, context.tokens).weight_bytes, pool)


def _pool_bytes(config: Mapping[str, Any], kv_cache: str, context_length: int) -> int:
    """The draft pool of a model of ``config`` for ``context_length`` positions in ``kv_cache``, as ``PagedKV`` holds
    it: a block is the largest KV group's layers' keys and values for ``BLOCK_SIZE`` positions."""
    shape = model_shape(config)
    groups = KVGroups.of(config_windows(config, shape.layers))
    block_bytes = groups.page_layers * 2 * shape.kv_heads * BLOCK_SIZE * kv_row_bytes(kv_cache, shape.head_dim)
    return draft_pool_blocks(context_length, BLOCK_SIZE, len(groups.windows)) * block_bytes


def target_refused(target: LoadedModel) -> str | None:
    """Why no draft model can draft for ``target`` (checked before one is loaded); None when one can."""
    if isinstance(target.backend, HFBackend):
        return "the model runs through transformers, one request at a time, where nothing drafts"
    return None


def draft_refused(target: LoadedModel, draft: LoadedModel) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (a sentence's end, after "not used:"); None when it can."""
    if isinstance(draft.backend, HFBackend):
        return "it does not run on Hearth's fast path, whose batched steps drafting needs"
    if draft.device != target.device:
        return f"it loaded on the {draft.device.upper()}, the model on the {target.device.upper()}"
    return vocabulary_difference(target.tokenizer, draft.tokenizer)


def vocabulary_difference(target: Any, draft: Any) -> str | None:
    """How the tokenizers' vocabularies differ (sizes, the tokens under the same ids, the special tokens); None when
    they are the same."""
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if len(target_vocab) != len(draft_vocab):
        return f"its tokenizer has {len(draft_vocab):,} tokens, the model's {len(target_vocab):,}"
    if target_vocab != draft_vocab:
        differing = sum(draft_vocab.get(token) != index for token, index in target_vocab.items())
        return f"{differing:,} of its tokenizer's tokens have other ids than the model's"
    if sorted(target.all_special_ids) != sorted(draft.all_special_ids):
        return "its tokenizer's special tokens (beginning, end, padding) differ from the model's"
    return None


def with_draft(target: LoadedModel, draft: LoadedModel) -> LoadedModel:
    """``target`` with ``draft`` drafting for it and a notice saying so with their memory, or ``target`` with a notice
    saying why not."""
    refused = draft_refused(target, draft)
    if refused is not None:
        return draft_not_used(target, draft.name, refused)
    one = draft.backend.new_pool(1, BLOCK_SIZE)
    blocks = draft_pool_blocks(min(target.context_length, draft.context_length), BLOCK_SIZE, len(one.windows))
    kv_bytes, positions = blocks * one.bytes_per_block, blocks // len(one.windows) * BLOCK_SIZE
    notice = (f"Drafting with {draft.name}: {gib_text(draft.weight_bytes)} of weights and at most "
              f"{gib_text(kv_bytes)} of KV cache ({positions:,} positions) beside the model.")
    return replace(target, draft=draft, notices=target.notices + (notice,))


def draft_not_used(target: LoadedModel, draft_name: str, why: str) -> LoadedModel:
    """``target`` alone, its notice saying why the draft model ``draft_name`` is not used."""
    return replace(target, notices=target.notices + (f"The draft model {draft_name} is not used: {why}.",))
