"""Attention in torch ops over keys and values already held (engine thread).

``attend`` is a prompt chunk's attention (SDPA under a causal mask, ``causal_mask``), and
``attend_in_blocks`` the same a block of rows at a time over the keys each block sees (the CPU's);
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
QUERY_BLOCK = 64
"""Rows of a prompt chunk that attend in one call of ``attend_in_blocks``: a call computes every score its keys
make, hidden or not, so a causal 512-row chunk in one call computes twice the scores its rows see; in blocks of 64
rows it computes 9/16 of the whole, and under a window only the keys near each block."""


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """A prompt chunk's attention: ``q`` [S, H, hd] (already scaled) over ``keys``/``values`` [Hkv, T, hd], ``mask``
    [S, T] added to the scores (``causal_mask``); query head ``h`` uses kv head ``h // (H / Hkv)``. Returns
    [S, H, hd]. SDPA runs in the mask's dtype (``FormatPlan.prompt_attention``)."""
    if softcap is not None or sinks is not None:
        return _attend_bmm(q, keys, values, mask, softcap, sinks)
    dtype = _attention_dtype(q, mask, softcap, sinks)
    attended = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0).to(dtype), keys.unsqueeze(0).to(dtype),
                                              values.unsqueeze(0).to(dtype), attn_mask=mask, scale=1.0, enable_gqa=True)
    return attended[0].transpose(0, 1).to(q.dtype)  # [S, H, hd]


def _attention_dtype(q: torch.Tensor, mask: torch.Tensor, softcap: float | None,
                    sinks: torch.Tensor | None) -> torch.dtype:
    """The dtype ``attend`` multiplies in: the mask's for SDPA, the queries' for soft-capped scores or sinks."""
    return q.dtype if softcap is not None or sinks is not None else mask.dtype


def attend_in_blocks(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``attend``, ``QUERY_BLOCK`` rows of ``q`` [S, H, hd] at a time, each block over the run of keys its rows'
    ``mask`` [S, T] leaves visible: [S, H, hd]. The runs are read off the mask, which waits for it: for the CPU."""
    length = q.shape[0]
    if length <= QUERY_BLOCK:
        return attend(q, keys, values, mask, softcap, sinks)
    dtype = _attention_dtype(q, mask, softcap, sinks)
    keys, values = keys.to(dtype), values.to(dtype)  # widened once, not once a block
    attended = torch.empty_like(q)  # [S, H, hd]
    seen = mask == 0  # [S, T]
    for start in range(0, length, QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        first, end = _visible_run(seen[rows])
        attended[rows] = attend(q[rows], keys[:, first:end], values[:, first:end], mask[rows, first:end], softcap,
                                sinks)
    return attended


def _visible_run(seen: torch.Tensor) -> tuple[int, int]:
    """The first and one past the last key any row of ``seen`` [S, T] (True: visible) sees; all ``T`` if none."""
    columns = seen.any(dim=0).nonzero()  # [n, 1]
    if columns.numel() == 0:
        return 0, seen.shape[1]
    return int(columns[0]), int(columns[-1]) + 1


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
