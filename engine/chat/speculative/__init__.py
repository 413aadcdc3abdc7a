"""Speculative decoding for the batch runner (engine thread).

A decoding sequence may feed, beside the token it said last, a few drafted tokens
from its request's ``draft_source``: the conversation itself (``prompt_lookup``: the
continuation of the latest earlier occurrence of its last few tokens, no second
model), or a small draft model with the same tokenizer where the load has one
(``engine/service/draft_model.py``: greedy drafts, batched across requests). The target model
verifies them in the same batched step (the sequence contributes k + 1 rows, the
others one each); the runner keeps the drafted tokens the sampler accepts
(``Sampler.verify``) and the scheduler rolls its blocks back past the first
rejected one. ``draft_length`` sizes each draft from the recent acceptance and
pauses drafting where it stops paying (a model's draft charged its draft steps too);
``speculation`` holds one request's source, length and counters.
"""
