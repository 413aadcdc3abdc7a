"""Continuous batching over a block-wise KV cache: bookkeeping only (engine thread).

``block_pool`` owns the loaded model's KV blocks (ref counts, least-recently-used
eviction of blocks no sequence holds) and the prefix index that lets any prompt
reuse the longest cached prefix of any conversation. ``scheduler`` decides, step by
step, which tokens of which running sequences the next forward pass computes, admits
waiting requests as blocks allow, and preempts one when the pool runs short;
``step_pacer`` sizes the prompt tokens a step takes beside decoding rows from what
steps have cost.
``conversation_chains`` remembers which cached runs each conversation left, so a
deleted conversation's blocks can be freed. None of them runs the model: the runtime
(``engine/service``) executes each step they plan.
"""
