"""The decode loop against transformers' own generate(): same tokens, reuse gives the same text.

The decode loop serves backends without batching (``HFBackend``); the fast path's replies go through the batch
runner (``tests/engine/forward``, ``tests/engine/service``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.chat.generation import CachedSequence, DecodeLoop
from engine.forward.backend import HFBackend
from engine.protocol.messages import GREEDY, ChatMessage, SamplingParams


@pytest.fixture(scope="module")
def tiny_loaded(tiny_loaded, tiny_model_dir):
    """The tiny model as the engine loads it, run by transformers (``HFBackend``)."""
    from transformers import AutoModelForCausalLM

    return replace(tiny_loaded, backend=HFBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()))


def _loop(loaded, sampling=GREEDY, cancelled=lambda: False, pieces=None, stop_at_eos=True) -> DecodeLoop:
    """``stop_at_eos=False`` keeps the random model talking, to reach the other limits for sure."""
    return DecodeLoop(
        loaded.backend, loaded.tokenizer, sampling, loaded.eos_ids if stop_at_eos else frozenset(), loaded.context_length,
        is_cancelled=cancelled,
        on_prefill=lambda reused, ms: None,
        on_text=lambda text, count: pieces.append(text) if pieces is not None else None,
    )


def _prompt(loaded, *turns: str) -> list[int]:
    roles = ["user", "assistant"]
    messages = [ChatMessage(roles[i % 2], text) for i, text in enumerate(turns)]
    return loaded.tokenize(loaded.render(messages))


def _hf_greedy(hf_model, loaded, prompt_ids: list[int], new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False,
            eos_token_id=sorted(loaded.eos_ids), pad_token_id=0,
        )
    return out[0, len(prompt_ids):].tolist()


def test_greedy_tokens_equal_model_generate(tiny_loaded) -> None:
    loaded, hf_model = tiny_loaded, tiny_loaded.backend.model
    prompt = _prompt(loaded, "Paris is the capital of")
    expected = _hf_greedy(hf_model, loaded, prompt, 24)
    seq = CachedSequence(loaded.backend.new_cache())
    outcome = _loop(loaded, SamplingParams(temperature=0, max_new_tokens=24, repetition_penalty=1.0)).run(seq, prompt)
    generated = seq.token_ids[len(prompt):]
    # The cache holds every generated token but the last, which was sampled and not fed back.
    assert generated == expected[: len(generated)]
    assert outcome.tokens_generated == len(expected) - (expected[-1] in loaded.eos_ids)
    assert outcome.text == loaded.tokenizer.decode(expected, skip_special_tokens=True)


def test_reused_cache_gives_the_same_reply_as_a_fresh_one(tiny_loaded) -> None:
    reused_seq = CachedSequence(tiny_loaded.backend.new_cache())
    history: list[str] = []
    for turn in range(4):
        history.append(f"Turn {turn}: tell me about the quick brown fox")
        prompt = _prompt(tiny_loaded, *history)
        with_reuse = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=12)).run(reused_seq, prompt)
        fresh = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=12)).run(
            CachedSequence(tiny_loaded.backend.new_cache()), prompt
        )
        assert with_reuse.text == fresh.text
        assert fresh.reused_tokens == 0
        if turn:
            assert with_reuse.reused_tokens > 0
        history.append(with_reuse.text)


def test_same_seed_same_text_other_seed_other_text(tiny_loaded) -> None:
    prompt = _prompt(tiny_loaded, "Write something")

    def sample(seed: int) -> str:
        params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=20, seed=seed)
        return _loop(tiny_loaded, params).run(CachedSequence(tiny_loaded.backend.new_cache()), prompt).text

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_stops_at_max_tokens_and_says_so(tiny_loaded) -> None:
    prompt = _prompt(tiny_loaded, "Hello")
    outcome = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=3), stop_at_eos=False).run(
        CachedSequence(tiny_loaded.backend.new_cache()), prompt
    )
    assert (outcome.finish_reason, outcome.tokens_generated) == ("max_tokens", 3)


def test_stop_string_ends_the_reply_without_showing_it(tiny_loaded) -> None:
    prompt = _prompt(tiny_loaded, "Paris is the capital of")
    free = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=30)).run(
        CachedSequence(tiny_loaded.backend.new_cache()), prompt
    )
    stop = free.text[4:7]
    assert len(stop) == 3, "the tiny model should say something to stop on"
    pieces: list[str] = []
    stopped = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=30, stop=(stop,)), pieces=pieces).run(
        CachedSequence(tiny_loaded.backend.new_cache()), prompt
    )
    assert stopped.finish_reason == "stop_string"
    assert stopped.text == free.text[: free.text.index(stop)]
    assert "".join(pieces) == stopped.text


def test_cancel_is_acknowledged_within_one_step(tiny_loaded) -> None:
    prompt = _prompt(tiny_loaded, "Hello")
    steps = []
    loop = _loop(
        tiny_loaded, SamplingParams(temperature=0, max_new_tokens=50),
        cancelled=lambda: steps.append(1) or len(steps) >= 3, stop_at_eos=False,  # the first ask: before the prefill
    )
    outcome = loop.run(CachedSequence(tiny_loaded.backend.new_cache()), prompt)
    assert outcome.finish_reason == "cancelled"
    assert outcome.tokens_generated == 2


def test_context_full_stops_the_reply(tiny_loaded) -> None:
    prompt = _prompt(tiny_loaded, "Hello")
    loop = _loop(tiny_loaded, SamplingParams(temperature=0, max_new_tokens=100), stop_at_eos=False)
    outcome = replace(loop, context_length=len(prompt) + 4).run(CachedSequence(tiny_loaded.backend.new_cache()), prompt)
    assert outcome.finish_reason == "context_full"
    assert outcome.tokens_generated == 4


class _CountingBackend:
    """The tiny model's backend, with the token count of each forward pass kept."""

    def __init__(self, backend, prefill_chunk: int) -> None:
        self._backend = backend
        self.prefill_chunk = prefill_chunk
        self.fed: list[int] = []

    def forward(self, token_ids, kv, start):
        self.fed.append(len(token_ids))
        return self._backend.forward(token_ids, kv, start)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


def test_a_request_cancelled_while_queued_runs_no_forward_pass(tiny_loaded) -> None:
    backend = _CountingBackend(tiny_loaded.backend, prefill_chunk=8)
    prefills: list[int] = []
    loop = replace(_loop(tiny_loaded, cancelled=lambda: True), backend=backend, on_prefill=lambda r, ms: prefills.append(r))
    seq = CachedSequence(tiny_loaded.backend.new_cache())
    outcome = loop.run(seq, _prompt(tiny_loaded, "Hello"))
    assert (outcome.finish_reason, outcome.tokens_generated, outcome.text) == ("cancelled", 0, "")
    assert backend.fed == [] and seq.token_ids == []
    assert prefills == [0], "the reply still says it prefilled (nothing), as every reply does"


def test_a_request_cancelled_mid_prefill_stops_before_the_next_chunk(tiny_loaded) -> None:
    backend = _CountingBackend(tiny_loaded.backend, prefill_chunk=8)
    prompt = _prompt(tiny_loaded, "Tell me about the quick brown fox and the lazy dog")
    assert len(prompt) > 3 * 8
    loop = replace(_loop(tiny_loaded, cancelled=lambda: len(backend.fed) >= 2), backend=backend)
    seq = CachedSequence(tiny_loaded.backend.new_cache())
    outcome = loop.run(seq, prompt)
    assert (outcome.finish_reason, outcome.tokens_generated) == ("cancelled", 0)
    assert backend.fed == [8, 8] and seq.token_ids == prompt[:16], "two chunks ran, and stay cached"
