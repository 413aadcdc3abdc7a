"""What runs a model's forward pass: the one place that calls the model (engine thread).

``BatchBackend`` is what the batch runner (``engine/service/batch_runner.py``) drives:
a block pool for the keys and values of every sequence, and a step over several
sequences' new tokens at once; a single reply is a batch of one. The fast paths
implement it (``cpu_backend``, ``cuda_backend``). ``HFBackend`` drives any other
transformers causal LM one request at a time through its own ``DynamicCache``, with
the three operations of ``Backend``: feed tokens and get the logits of the last one,
crop a cache to a prefix, and measure a cache.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, Sequence

import torch

from engine.forward.paged_kv import BatchRow, PagedKV

PREFILL_CHUNK = 512
"""Prompt tokens per forward call: bounds the attention's working memory ([S, T] scores and mask)."""


class BatchBackend(Protocol):
    """What the batch runner needs from a model: a block pool and a step over many sequences."""

    device: torch.device
    batch_step_tokens: int
    """Tokens per step while sequences decode, until the scheduler's pacer knows what steps cost."""
    batch_max_running: int
    """Sequences in one step at most."""

    def new_pool(self, num_blocks: int, block_size: int) -> PagedKV:
        """A KV store of ``num_blocks`` blocks of ``block_size`` positions for this model."""
        ...

    def forward_batch(self, rows: Sequence[BatchRow], kv: PagedKV) -> torch.Tensor:
        """Each row's tokens appended to its blocks of ``kv``; logits of each row's last ``logit_rows`` tokens, row
        after row, [sum of logit_rows, V] fp32 ([B, V] with one each)."""
        ...


class Backend(Protocol):
    """What the decode loop needs from a model it runs one request at a time."""

    device: torch.device
    prefill_chunk: int

    def new_cache(self) -> Any: ...

    def forward(self, token_ids: Sequence[int], cache: Any, start: int) -> torch.Tensor:
        """Append ``token_ids`` at position ``start`` of ``cache``; logits of the last one, [V] fp32."""
        ...

    def crop(self, cache: Any, length: int) -> Any:
        """Keep the first ``length`` positions of ``cache``; returns the cache to use from now on."""
        ...

    def cache_bytes(self, cache: Any) -> int: ...


def _cache_keyword(model: torch.nn.Module) -> str:
    """transformers renamed ``past_key_values=`` to ``cache=`` (5.2x); use what this version takes."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class HFBackend:
    """Any transformers causal LM, with a ``DynamicCache`` per conversation."""

    prefill_chunk = PREFILL_CHUNK

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._cache_kw = _cache_keyword(model)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], cache: Any, start: int) -> torch.Tensor:
        input_ids = torch.tensor([list(token_ids)], device=self.device)  # [1, S]
        positions = torch.arange(start, start + len(token_ids), device=self.device)  # [S]
        out = self.model(
            input_ids=input_ids,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[0, -1].float()  # [V]

    def crop(self, cache: Any, length: int) -> Any:
        held = cache.get_seq_length()
        if length <= 0:
            return self.new_cache()
        if length < held:
            # A negative count means "drop this many" in every 5.x release (a positive one changed meaning).
            cache.crop(-(held - length))
        return cache

    def cache_bytes(self, cache: Any) -> int:
        total = 0
        for layer in getattr(cache, "layers", ()):
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
        return total
