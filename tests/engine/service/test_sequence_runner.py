"""The transformers fallback's runner, one request at a time and a step at a time: what transformers' own
generate() says, cache reuse, the stop conditions, and a cancel within one step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.chat.prompt import PromptPlan
from engine.forward.backend import HFBackend
from engine.host.memory import read_memory
from engine.protocol.messages import (
    GREEDY,
    ChatMessage,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service.reply_events import ReplyEvents
from engine.service.sequence_runner import SequenceRunner


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def hf_loaded(tiny_loaded, hf_model):
    """The tiny model through transformers (``HFBackend``), with its tokenizer and template."""
    return replace(tiny_loaded, backend=HFBackend(hf_model))


class _Run:
    """A runner and every event it sent; ``cancelled`` may grow between steps."""

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.events: list = []
        self.cancelled: set[str] = set()
        self.steps = 0
        self.runner = SequenceRunner(loaded, self.cancelled.__contains__)

    def add(self, request_id: str, prompt: list[int], sampling: SamplingParams = GREEDY, conversation: str = "") -> None:
        plan = PromptPlan(prompt, ())
        events = ReplyEvents(self.events.append, request_id, plan, 0.0, self.loaded.context_length, 0.0)
        self.runner.add(request_id, conversation or request_id, prompt, sampling, events)

    def step(self) -> None:
        self.steps += 1
        self.runner.step(lambda held: read_memory("cpu", 0, held, 0))

    def run(self) -> None:
        while self.runner.has_work:
            self.step()

    def of(self, kind, request_id: str) -> list:
        return [e for e in self.events if isinstance(e, kind) and e.request_id == request_id]

    def finished(self, request_id: str) -> ReplyFinished:
        return self.of(ReplyFinished, request_id)[0]


def _reply(loaded, prompt: list[int], sampling: SamplingParams = GREEDY, conversation: str = "") -> ReplyFinished:
    run = _Run(loaded)
    run.add("r", prompt, sampling, conversation)
    run.run()
    return run.finished("r")


def _prompt(loaded, *turns: str) -> list[int]:
    roles = ["user", "assistant"]
    return loaded.tokenize(loaded.render([ChatMessage(roles[i % 2], text) for i, text in enumerate(turns)]))


def _talkative(loaded):
    """The model without an end-of-sequence token: it talks until another limit stops it."""
    return replace(loaded, eos_ids=frozenset())


def test_greedy_reply_equals_transformers_generate(hf_loaded, hf_model) -> None:
    prompt = _prompt(hf_loaded, "Paris is the capital of")
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                eos_token_id=sorted(hf_loaded.eos_ids), pad_token_id=0)
    expected = out[0, len(prompt):].tolist()
    finished = _reply(hf_loaded, prompt, replace(GREEDY, max_new_tokens=24))
    assert finished.stats.tokens_generated == len(expected) - (expected[-1] in hf_loaded.eos_ids)
    assert finished.text == hf_loaded.tokenizer.decode(expected, skip_special_tokens=True)


def test_a_conversation_reuses_its_cache_and_says_what_a_fresh_cache_says(hf_loaded) -> None:
    run = _Run(hf_loaded)
    history: list[str] = []
    sampling = replace(GREEDY, max_new_tokens=12)
    for turn in range(4):
        history.append(f"Turn {turn}: tell me about the quick brown fox")
        prompt = _prompt(hf_loaded, *history)
        run.add(f"turn{turn}", prompt, sampling, conversation="chat")
        run.run()
        with_reuse = run.finished(f"turn{turn}")
        fresh = _reply(hf_loaded, prompt, sampling)
        assert with_reuse.text == fresh.text
        assert fresh.stats.reused_tokens == 0
        if turn:
            assert with_reuse.stats.reused_tokens > 0
        history.append(with_reuse.text)


def test_requests_are_answered_one_after_another_in_arrival_order(hf_loaded) -> None:
    run = _Run(hf_loaded)
    prompts = {name: _prompt(hf_loaded, f"Tell me about {name}") for name in ("first", "second")}
    for name, prompt in prompts.items():
        run.add(name, prompt, replace(GREEDY, max_new_tokens=6))
    run.run()
    order = [(type(e).__name__, e.request_id) for e in run.events if isinstance(e, (PrefillDone, ReplyFinished))]
    assert order == [("PrefillDone", "first"), ("ReplyFinished", "first"),
                     ("PrefillDone", "second"), ("ReplyFinished", "second")]
    for name, prompt in prompts.items():
        assert run.finished(name).text == _reply(hf_loaded, prompt, replace(GREEDY, max_new_tokens=6)).text


def test_same_seed_same_text_other_seed_other_text(hf_loaded) -> None:
    prompt = _prompt(hf_loaded, "Write something")

    def sample(seed: int) -> str:
        return _reply(hf_loaded, prompt, SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0,
                                                        max_new_tokens=20, seed=seed)).text

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_stops_at_max_tokens_and_says_so(hf_loaded) -> None:
    stats = _reply(_talkative(hf_loaded), _prompt(hf_loaded, "Hello"), replace(GREEDY, max_new_tokens=3)).stats
    assert (stats.finish_reason, stats.tokens_generated) == ("max_tokens", 3)


def test_stop_string_ends_the_reply_without_showing_it(hf_loaded) -> None:
    prompt = _prompt(hf_loaded, "Paris is the capital of")
    free = _reply(hf_loaded, prompt, replace(GREEDY, max_new_tokens=30)).text
    stop = free[4:7]
    assert len(stop) == 3, "the tiny model should say something to stop on"
    run = _Run(hf_loaded)
    run.add("r", prompt, replace(GREEDY, max_new_tokens=30, stop=(stop,)))
    run.run()
    stopped = run.finished("r")
    assert stopped.stats.finish_reason == "stop_string"
    assert stopped.text == free[: free.index(stop)]
    assert "".join(e.text for e in run.of(TokenStreamed, "r")) == stopped.text


def test_context_full_stops_the_reply(hf_loaded) -> None:
    prompt = _prompt(hf_loaded, "Hello")
    stats = _reply(replace(_talkative(hf_loaded), context_length=len(prompt) + 4), prompt,
                   replace(GREEDY, max_new_tokens=100)).stats
    assert (stats.finish_reason, stats.tokens_generated) == ("context_full", 4)


def test_a_cancel_ends_the_reply_at_the_next_step(hf_loaded) -> None:
    run = _Run(_talkative(hf_loaded))
    run.add("r", _prompt(hf_loaded, "Hello"), replace(GREEDY, max_new_tokens=50))
    while len(run.of(TokenStreamed, "r")) < 2:
        run.step()
    run.cancelled.add("r")
    run.step()
    stats = run.finished("r").stats
    assert (stats.finish_reason, stats.tokens_generated) == ("cancelled", 2)
    assert not run.runner.has_work


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


def test_a_step_is_one_prefill_chunk_or_one_token(hf_loaded) -> None:
    backend = _CountingBackend(hf_loaded.backend, prefill_chunk=8)
    run = _Run(replace(_talkative(hf_loaded), backend=backend))
    prompt = _prompt(hf_loaded, "Hello there")
    run.add("r", prompt, replace(GREEDY, max_new_tokens=5))
    chunks = -(-len(prompt) // 8)
    for _ in range(chunks):
        run.step()
    assert backend.fed == [8] * (chunks - 1) + [len(prompt) - 8 * (chunks - 1)] and run.of(PrefillDone, "r")
    for fed in range(1, 5):
        run.step()
        assert backend.fed[chunks:] == [1] * fed
    assert run.finished("r").stats.tokens_generated == 5


def test_a_request_cancelled_while_queued_runs_no_forward_pass(hf_loaded) -> None:
    backend = _CountingBackend(hf_loaded.backend, prefill_chunk=8)
    run = _Run(replace(hf_loaded, backend=backend))
    run.add("queued", _prompt(hf_loaded, "Hello"))
    run.cancelled.add("queued")
    run.run()
    stats = run.finished("queued").stats
    assert (stats.finish_reason, stats.tokens_generated, run.finished("queued").text) == ("cancelled", 0, "")
    assert backend.fed == []
    assert [e.reused_tokens for e in run.of(PrefillDone, "queued")] == [0], "it still says it prefilled (nothing)"


def test_a_request_cancelled_mid_prefill_stops_before_the_next_chunk(hf_loaded) -> None:
    backend = _CountingBackend(hf_loaded.backend, prefill_chunk=8)
    run = _Run(replace(hf_loaded, backend=backend))
    prompt = _prompt(hf_loaded, "Tell me about the quick brown fox and the lazy dog")
    assert len(prompt) > 3 * 8
    run.add("r", prompt)
    run.step()
    run.step()
    run.cancelled.add("r")
    run.run()
    stats = run.finished("r").stats
    assert (stats.finish_reason, stats.tokens_generated) == ("cancelled", 0)
    assert backend.fed == [8, 8], "two chunks ran"
    assert run.runner.caches.held_tokens("r") == prompt[:16], "and stay cached"


def test_a_failed_forward_keeps_the_partial_reply_and_the_next_request_runs(hf_loaded, monkeypatch) -> None:
    backend = _CountingBackend(hf_loaded.backend, prefill_chunk=512)
    run = _Run(replace(_talkative(hf_loaded), backend=backend))
    run.add("broken", _prompt(hf_loaded, "Hello"), replace(GREEDY, max_new_tokens=50))
    run.add("next", _prompt(hf_loaded, "Hello"), replace(GREEDY, max_new_tokens=4))
    while len(run.of(TokenStreamed, "broken")) < 3:
        run.step()
    def out_of_memory(*args):
        raise MemoryError("out of memory")

    monkeypatch.setattr(backend, "forward", out_of_memory)
    run.step()
    monkeypatch.undo()
    run.run()
    failed = run.of(ReplyFailed, "broken")[0]
    assert "out of memory" in failed.message and failed.partial_text == "".join(
        e.text for e in run.of(TokenStreamed, "broken"))
    assert run.finished("next").stats.tokens_generated == 4
    assert run.runner.caches.held_tokens("broken") == [], "the broken reply's cache was dropped"
