"""Continuous batching as a user sees it: several replies at once, each as it would be alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.chat.prompt import PromptPlan
from engine.protocol.messages import (
    BatchSampled,
    Cancel,
    ChatMessage,
    Generate,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.scheduler.scheduler import IDLE_STEP_TOKENS
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents

LONG_GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
TOPICS = ["fox", "Paris and the capital of France", "def main", "emoji 🔥", "lazy dog " * 6, "Hearth", "CJK 你好", "x " * 40]


def _messages(index: int) -> tuple[ChatMessage, ...]:
    return (ChatMessage("user", f"Tell me about {TOPICS[index]} ({index})"),)


def _prompt(tiny_loaded, index: int) -> list[int]:
    return tiny_loaded.tokenize(tiny_loaded.render(_messages(index)))


@pytest.fixture
def alone(tiny_loaded, reply_alone):
    """``alone(prompt_ids, sampling)``: the text the tiny model says for the prompt alone."""
    return lambda prompt_ids, sampling: reply_alone(tiny_loaded, prompt_ids, sampling).text


class _Events:
    """Every event the engine sends, kept, so that none is lost while waiting for another."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.seen: list = []

    def wait_for(self, kind, request_ids: set[str]) -> None:
        while not any(isinstance(e, kind) and e.request_id in request_ids for e in self.seen):
            self.seen.append(self.engine.events.get(timeout=120))
            if isinstance(self.seen[-1], ReplyFailed):
                raise AssertionError(self.seen[-1].message)

    def finished(self, request_ids: set[str]) -> dict[str, ReplyFinished]:
        for request_id in request_ids:
            self.wait_for(ReplyFinished, {request_id})
        return {e.request_id: e for e in self.seen if isinstance(e, ReplyFinished) and e.request_id in request_ids}

    def most_at_once(self) -> int:
        """The most replies between their ``PrefillDone`` and their ``ReplyFinished`` at one moment."""
        open_now, most = 0, 0
        for event in self.seen:
            open_now += isinstance(event, PrefillDone) - isinstance(event, ReplyFinished)
            most = max(most, open_now)
        return most


def test_eight_requests_joining_at_different_steps_say_what_each_says_alone(engine, tiny_loaded, alone) -> None:
    events = _Events(engine)
    for index in range(8):
        engine.thread.submit(Generate(f"join-{index}", f"c{index}", _messages(index), LONG_GREEDY))
        if index in (0, 4):
            events.wait_for(TokenStreamed, {f"join-{index}"})  # the next ones arrive while this one streams
    finished = events.finished({f"join-{i}" for i in range(8)})
    assert events.most_at_once() >= 3, "several replies streamed at once"
    for index in range(8):
        assert finished[f"join-{index}"].text == alone(_prompt(tiny_loaded, index), LONG_GREEDY)
        assert finished[f"join-{index}"].stats.prompt_tokens == len(_prompt(tiny_loaded, index))


def test_cancelling_one_of_eight_streams_leaves_the_other_seven_unchanged(engine, tiny_loaded, alone) -> None:
    sampling = SamplingParams(temperature=0, max_new_tokens=40)
    events = _Events(engine)
    for index in range(8):
        engine.thread.submit(Generate(f"cancel-{index}", f"k{index}", _messages(index), sampling))
    events.wait_for(TokenStreamed, {"cancel-5"})
    engine.thread.submit(Cancel("cancel-5"))
    finished = events.finished({f"cancel-{i}" for i in range(8)})
    assert finished["cancel-5"].stats.finish_reason in ("cancelled", "eos")
    assert finished["cancel-5"].stats.tokens_generated < 40
    for index in (0, 1, 2, 3, 4, 6, 7):
        assert finished[f"cancel-{index}"].text == alone(_prompt(tiny_loaded, index), sampling)


class _Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def __call__(self, event) -> None:
        self.events.append(event)

    def of(self, kind, request_id: str) -> list:
        return [e for e in self.events if isinstance(e, kind) and e.request_id == request_id]


def _runner(tiny_loaded, budget_bytes: int | None = None, cancelled=frozenset()) -> tuple[BatchRunner, _Recorder]:
    """``cancelled``: a set of request ids the runner sees as cancelled (it may grow between steps)."""
    recorder = _Recorder()
    kwargs = {} if budget_bytes is None else {"budget_bytes": budget_bytes}
    return BatchRunner(tiny_loaded, recorder, cancelled.__contains__, **kwargs), recorder


def _add(runner: BatchRunner, recorder: _Recorder, request_id: str, prompt_ids: list[int], sampling: SamplingParams) -> None:
    events = ReplyEvents(recorder, request_id, PromptPlan(prompt_ids, ()), 0.0, 1024, 0.0)
    stops = runner._loaded.template.stop_strings  # as the runtime adds them, and ``reply_alone``
    runner.add(request_id, request_id, prompt_ids, replace(sampling, stop=sampling.stop + stops), events)


def _memory(held: int):
    from engine.host.memory import read_memory

    return read_memory("cpu", 0, held, 0)


def test_eight_chats_with_one_long_system_prompt_hold_it_once(tiny_loaded, alone) -> None:
    runner, recorder = _runner(tiny_loaded)
    system = tiny_loaded.tokenize("The quick brown fox jumps over the lazy dog. " * 100)[:1000]
    sampling = SamplingParams(temperature=0, max_new_tokens=30)
    prompts = {f"chat{i}": system + tiny_loaded.tokenize(f" Question {i}?") for i in range(8)}
    _add(runner, recorder, "first", system + [5], replace(sampling, max_new_tokens=1))
    while runner.has_work:
        runner.step(_memory)
    for request_id, prompt in prompts.items():
        _add(runner, recorder, request_id, prompt, sampling)
    while runner.scheduler.waiting:  # those sharing more than the cached prefix with chat0 wait for its prefill
        runner.step(_memory)
    pool = runner.scheduler.pool
    shared = runner.scheduler.get("chat0").blocks[: 1000 // 16]
    assert all(pool.blocks[b].ref_count == 8 for b in shared)
    held = runner.scheduler.held_tokens()
    assert held <= 1.2 * 1000 + 8 * 16, f"{held} positions held for one 1000-token prefix and eight short questions"
    while runner.has_work:
        runner.step(_memory)
    assert all(recorder.of(PrefillDone, r)[0].reused_tokens >= 992 for r in prompts)
    for request_id, prompt in prompts.items():
        assert recorder.of(ReplyFinished, request_id)[0].text == alone(prompt, sampling)


def test_a_full_pool_makes_a_request_wait_and_then_completes_it(tiny_loaded, alone) -> None:
    probe, _ = _runner(tiny_loaded)
    runner, recorder = _runner(tiny_loaded, budget_bytes=12 * probe.bytes_per_block)  # 12 blocks of 16 positions
    sampling = SamplingParams(temperature=0, max_new_tokens=30)
    prompts = {name: tiny_loaded.tokenize(f"{name}: the quick brown fox jumps over the lazy dog, twice over.") * 5
               for name in ("one", "two")}
    for name, prompt in prompts.items():
        _add(runner, recorder, name, prompt, sampling)
    runner.step(_memory)
    assert [s.request_id for s in runner.scheduler.waiting] == ["two"]
    while runner.has_work:
        runner.step(_memory)
    for name, prompt in prompts.items():
        assert recorder.of(ReplyFinished, name)[0].text == alone(prompt, sampling)
    samples = [e for e in recorder.events if isinstance(e, BatchSampled)]
    assert samples and samples[0].waiting == 1 and samples[0].pool.blocks_total == 12


def test_a_prompt_larger_than_the_pool_fails_clearly_and_the_next_one_works(tiny_loaded) -> None:
    probe, _ = _runner(tiny_loaded)
    runner, recorder = _runner(tiny_loaded, budget_bytes=4 * probe.bytes_per_block)
    _add(runner, recorder, "huge", list(range(3, 200)), SamplingParams(temperature=0, max_new_tokens=2))
    _add(runner, recorder, "small", [5, 6, 7], SamplingParams(temperature=0, max_new_tokens=2))
    while runner.has_work:
        runner.step(_memory)
    assert "needs 197 positions" in recorder.of(ReplyFailed, "huge")[0].message
    assert recorder.of(ReplyFinished, "small")[0].stats.tokens_generated > 0


def test_a_request_whose_sampling_fails_ends_alone_with_a_message(tiny_loaded, alone) -> None:
    runner, recorder = _runner(tiny_loaded)
    sampling = SamplingParams(temperature=0, max_new_tokens=5)
    _add(runner, recorder, "bad", [5, 6, 7, 8], sampling)
    _add(runner, recorder, "good", [9, 10, 11], sampling)

    def broken(logits, allowed=None, drafted=None):
        raise ValueError("the sampler was given nonsense")

    runner._active["bad"].reply.sample = broken
    while runner.has_work:
        runner.step(_memory)
    assert "the sampler was given nonsense" in recorder.of(ReplyFailed, "bad")[0].message
    assert recorder.of(ReplyFinished, "good")[0].text == alone([9, 10, 11], sampling)
    assert runner.scheduler.pool.counts()[0] == 0


def test_the_batch_reports_its_state_and_ends_reported_idle(tiny_loaded) -> None:
    runner, recorder = _runner(tiny_loaded)
    for index in range(3):
        _add(runner, recorder, f"r{index}", [5 + index, 6, 7], SamplingParams(temperature=0, max_new_tokens=4))
    while runner.has_work:
        runner.step(_memory)
    samples = [e for e in recorder.events if isinstance(e, BatchSampled)]
    assert samples[0].running == 3 and samples[0].pool.blocks_used == 3 and samples[0].pool.block_size == 16
    assert (samples[-1].running, samples[-1].waiting, samples[-1].pool.blocks_used) == (0, 0, 0)
    assert samples[-1].pool.blocks_cached == 3, "the finished replies' blocks stay cached for reuse"


def test_cancelled_requests_never_reach_a_forward_pass_and_the_others_say_the_same(
        tiny_loaded, monkeypatch, alone) -> None:
    cancelled: set[str] = set()
    runner, recorder = _runner(tiny_loaded, cancelled=cancelled)
    rows: list[list[tuple[int, ...]]] = []  # the token ids of each row of each forward pass
    real_forward = tiny_loaded.backend.forward_batch
    monkeypatch.setattr(tiny_loaded.backend, "forward_batch",
                        lambda batch, kv: rows.append([tuple(r.token_ids) for r in batch]) or real_forward(batch, kv))
    sampling = SamplingParams(temperature=0, max_new_tokens=12)
    keep = _prompt(tiny_loaded, 0)
    queued = [7]  # one prompt token: waiting, it looked as if it were decoding
    chunked = [3 + i % 190 for i in range(IDLE_STEP_TOKENS - len(keep) + 1)]  # one token left after its first chunk
    for request_id, prompt in (("keep", keep), ("queued", queued), ("chunked", chunked)):
        _add(runner, recorder, request_id, prompt, sampling)
    cancelled.add("queued")
    runner.step(_memory)
    cancelled.add("chunked")
    while runner.has_work:
        runner.step(_memory)

    assert rows[0] == [tuple(keep), tuple(chunked[:-1])], "the queued request was dropped before the first step"
    assert all(len(step) == 1 for step in rows[1:]), "after its first chunk, the cancelled prompt was dropped"
    for request_id in ("queued", "chunked"):
        stats = recorder.of(ReplyFinished, request_id)[0].stats
        assert (stats.finish_reason, stats.tokens_generated) == ("cancelled", 0)
        assert recorder.of(TokenStreamed, request_id) == []
    assert recorder.of(ReplyFinished, "keep")[0].text == alone(keep, sampling)


def test_a_prompt_read_over_several_steps_says_how_far_it_got(tiny_loaded, monkeypatch) -> None:
    monkeypatch.setattr("engine.service.reply_events.PROMPT_PROGRESS_INTERVAL_S", 0.0)
    runner, recorder = _runner(tiny_loaded)
    prompt = tiny_loaded.tokenize("The quick brown fox jumps over the lazy dog. " * 200)[:2000]
    _add(runner, recorder, "long", prompt, SamplingParams(temperature=0, max_new_tokens=2))
    while runner.has_work:
        runner.step(_memory)
    progress = recorder.of(PromptProgress, "long")
    read = [event.computed_tokens for event in progress]
    assert len(read) >= 2 and read == sorted(set(read)) and read[-1] < len(prompt), read
    assert all(event.prompt_tokens == len(prompt) for event in progress)
    first_done = recorder.events.index(recorder.of(PrefillDone, "long")[0])
    assert all(recorder.events.index(event) < first_done for event in progress)


def test_a_short_prompt_sends_no_progress(tiny_loaded) -> None:
    runner, recorder = _runner(tiny_loaded)
    _add(runner, recorder, "short", tiny_loaded.tokenize("Hello there"), SamplingParams(temperature=0, max_new_tokens=2))
    while runner.has_work:
        runner.step(_memory)
    assert not recorder.of(PromptProgress, "short")
    assert recorder.of(ReplyFinished, "short")
