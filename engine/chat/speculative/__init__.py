"""Speculative decoding for the batch runner (engine thread).

A decoding sequence may feed, beside the token it said last, a few tokens drafted
from the conversation itself (``prompt_lookup``: the continuation of the latest
earlier occurrence of its last few tokens, no second model). The target model
verifies them in the same batched step (the sequence contributes k + 1 rows, the
others one each); the runner keeps the drafted tokens the sampler accepts
(``Sampler.verify``) and the scheduler rolls its blocks back past the first
rejected one. ``draft_length`` sizes each draft from the recent acceptance and
pauses drafting where it stops paying; ``speculation`` holds one request's state
and counters.
"""
