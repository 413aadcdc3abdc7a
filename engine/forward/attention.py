"""Attention in torch ops over keys and values already held (engine thread).

``attend`` is a prompt chunk's attention (SDPA under a causal mask, ``causal_mask``);
``attend_grouped`` and ``attend_runs`` one query's heads grouped by kv
head, over keys that lie in one run of the pool or in several. The fast forward pass
(``llama_forward``) uses them where Hearth's CPU kernels (``native.decode_attention``)
do not take a step's rows. The keys and values may be held in a narrower dtype than the
queries (the CPU pool's bf16): each is widened to the queries' dtype, exactly, before it
meets them. Each takes an optional ``softcap``: scores become ``softcap * tanh(scores /
softcap)`` before the softmax (Gemma 2), and optional ``sinks`` [H]: a logit per query head
that joins the softmax's denominator and weighs no value (gpt-oss's attention sinks); with
either, SDPA's place is taken by two batched matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SCORES_AT_ONCE = 1 << 24
"""Scores (fp32: 64 MB) the two-bmm path holds at once: a 512-row chunk of gpt-oss-20b's 64 heads over 8 192 keys
would hold 1 GB of them, so its rows go a slice at a time."""


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """A prompt chunk's attention: ``q`` [S, H, hd] (already scaled) over ``keys``/``values`` [Hkv, T, hd], ``mask``
    [S, T] added to the scores (``causal_mask``); query head ``h`` uses kv head ``h // (H / Hkv)``. Returns
    [S, H, hd]. SDPA runs in the mask's dtype (``FormatPlan.prompt_attention``)."""
    if softcap is not None or sinks is not None:
        return _attend_bmm(q, keys, values, mask, softcap, sinks)
    dtype = mask.dtype
    attended = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0).to(dtype), keys.unsqueeze(0).to(dtype),
                                              values.unsqueeze(0).to(dtype), attn_mask=mask, scale=1.0, enable_gqa=True)
    return attended[0].transpose(0, 1).to(q.dtype)  # [S, H, hd]


def _attend_bmm(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """``attend`` with soft-capped scores or sinks, in ``q``'s dtype: [S, H, hd]; a slice of the rows at a time
    where their scores would pass ``SCORES_AT_ONCE``."""
    length, heads, hd = q.shape
    rows = max(1, SCORES_AT_ONCE // (heads * keys.shape[1]))
    if length > rows:
        return torch.cat([_attend_bmm(q[start : start + rows], keys, values, mask[start : start + rows], softcap,
                                      sinks) for start in range(0, length, rows)])
    kv_heads = keys.shape[0]
    grouped = q.transpose(0, 1).reshape(kv_heads, -1, hd)  # [Hkv, G * S, hd]
    scores = _capped(torch.bmm(grouped, keys.to(q.dtype).transpose(1, 2)), softcap)  # [Hkv, G * S, T]
    scores = scores.view(kv_heads, -1, length, scores.shape[-1]).add_(mask.to(q.dtype))  # [Hkv, G, S, T]
    weights = _softmax(scores, None if sinks is None else sinks.view(kv_heads, -1, 1, 1))  # [Hkv, G, S, T]
    attended = torch.bmm(weights.flatten(1, 2), values.to(q.dtype))  # [Hkv, G * S, hd]
    return attended.view(heads, length, hd).transpose(0, 1)  # [S, H, hd]


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """The softmax of ``scores`` over their last dimension; with ``sinks`` (broadcast to them but for that
    dimension, size 1 there) each one's ``exp`` joins its row's denominator: ``exp(s - logaddexp(lse(s), sink))``."""
    if sinks is None:
        return scores.softmax(dim=-1)
    return scores.sub_(torch.logaddexp(scores.logsumexp(dim=-1, keepdim=True), sinks.to(scores.dtype))).exp_()


def _capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """``softcap * tanh(scores / softcap)`` in place; ``scores`` as they are without a cap."""
    return scores if softcap is None else scores.div_(softcap).tanh_().mul_(softcap)


def attend_grouped(queries: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, out: torch.Tensor,
                   softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One query's heads grouped by kv head, ``queries`` [Hkv, G, hd] (scaled), over ``keys_t`` [Hkv, hd, T] and
    ``values`` [Hkv, T, hd], into ``out`` [Hkv, G, hd]: two batched matmuls (called directly: ``@`` adds a dispatch
    layer) beat the fused kernel's setup. ``sinks``: [H], or None."""
    scores = _capped(torch.bmm(queries, keys_t.to(queries.dtype)), softcap)  # [Hkv, G, T]
    weights = _softmax(scores, None if sinks is None else sinks.view(*queries.shape[:2], 1))  # [Hkv, G, T]
    return torch.bmm(weights, values.to(queries.dtype), out=out)


def attend_runs(queries: torch.Tensor, runs: tuple[tuple[torch.Tensor, torch.Tensor], ...], out: torch.Tensor,
                softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``attend_grouped`` over keys and values that lie in several runs of the pool, ``runs`` of ([Hkv, hd, n],
    [Hkv, n, hd]) (a prefix another sequence holds, then this one's own blocks): every run's scores side by side,
    one softmax, each run's weighted values summed into ``out``; read in place, where gathering them would copy a
    shared prefix's keys per sequence, layer and step, which slows every step of chats that share a long prompt."""
    if len(runs) == 1:
        return attend_grouped(queries, *runs[0], out, softcap, sinks)
    scores = _capped(torch.cat([torch.bmm(queries, keys_t.to(queries.dtype)) for keys_t, _ in runs], dim=2),
                     softcap)  # [Hkv, G, T]
    weights = _softmax(scores, None if sinks is None else sinks.view(*queries.shape[:2], 1))  # [Hkv, G, T]
    start = 0
    for index, (_, values) in enumerate(runs):
        part = weights.narrow(2, start, values.shape[1])  # [Hkv, G, n]
        values = values.to(queries.dtype)
        if index == 0:
            torch.bmm(part, values, out=out)
        else:
            out.baddbmm_(part, values)
        start += values.shape[1]
    return out


def causal_mask(start: int, length: int, dtype: torch.dtype, device: torch.device, first: int = 0,
                window: int | None = None) -> torch.Tensor | None:
    """Query ``i`` (at position ``start + i``) sees keys ``first … start + i`` (the keys held from position
    ``first`` on), and under a ``window`` only those after ``start + i - window``: 0 there, -inf elsewhere, added
    to the scores (SDPA turns a boolean mask into this on every call); ``None`` for a single query (its keys are
    exactly those it sees)."""
    if length == 1:
        return None
    keys = torch.arange(first, start + length, device=device)  # [T]
    queries = torch.arange(start, start + length, device=device).unsqueeze(1)  # [S, 1]
    hidden = keys.unsqueeze(0) > queries  # [S, T]
    if window is not None:
        hidden |= keys.unsqueeze(0) <= queries - window
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, float("-inf"))
