"""One engine loop: requests that arrive while replies stream are served between two steps, not after the last
reply; a shutdown ends every running reply within one step; the transformers fallback streams a step at a time."""

from __future__ import annotations

import statistics
import time

import pytest

from engine.protocol.messages import (
    ENGINE_FAILURE,
    ChatMessage,
    EngineError,
    ForgetConversation,
    Generate,
    InspectFailed,
    InspectModel,
    LoadFailed,
    LoadModel,
    LoadOptions,
    ModelInspected,
    ModelLoaded,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service.runtime import ONE_AT_A_TIME_NOTICE

STREAMS = 8
QUESTIONS = [
    "What is the capital of France?", "Name three colours.", "What is two plus two?", "Say hello in Spanish.",
    "What do bees make?", "Name a large ocean.", "What is the opposite of hot?", "How many legs has a cat?",
]
SAMPLING = SamplingParams(temperature=0, max_new_tokens=12)
FP32 = LoadOptions(device="cpu", precision="fp32")
MOST_STEPS = 5  # between a request's arrival and its answer, while eight replies stream


def _ask(engine, request_id: str, question: str, sampling: SamplingParams = SAMPLING, conversation: str = "") -> None:
    engine.thread.submit(Generate(request_id, conversation or request_id, (ChatMessage("user", question),), sampling))


class Streams:
    """Keeps ``STREAMS`` replies streaming on a real engine: each one that ends is followed by the next question,
    until ``total`` were asked. Every event is kept, in order."""

    def __init__(self, engine, tag: str) -> None:
        self.engine = engine
        self.tag = tag
        self.events: list = []
        self.asked = 0
        self.texts: dict[str, str] = {}  # question -> the reply's text (each time the same)
        self.differing: list[str] = []

    def run(self, total: int, on_ended=lambda ended: None) -> None:
        """``on_ended(count)`` is called after each reply of the stream ends."""
        for _ in range(STREAMS):
            self._ask_next()
        ended = 0
        while ended < self.asked:
            event = self.next_event()
            if getattr(event, "request_id", "").startswith(self.tag) and isinstance(event, ReplyFinished):
                ended += 1
                self._keep(event)
                if self.asked < total:
                    self._ask_next()
                on_ended(ended)

    def next_event(self):
        event = self.engine.events.get(timeout=300)
        self.events.append(event)
        if isinstance(event, ReplyFailed):
            raise AssertionError(f"{event.request_id}: {event.message}")
        return event

    def wait_for(self, kinds, request_id: str):
        """The event of ``kinds`` for ``request_id``, seen already or the next one to come."""
        while True:
            found = [e for e in self.events if isinstance(e, kinds) and e.request_id == request_id]
            if found:
                return found[0]
            self.next_event()

    def tokens_between(self, since: float, answer) -> int:
        """How many tokens streamed from ``since`` (``perf_counter``) until ``answer`` went out."""
        before = self.events[: self.events.index(answer)]
        return sum(isinstance(e, TokenStreamed) and e.timestamp >= since for e in before)

    def _ask_next(self) -> None:
        index = self.asked
        self.asked += 1
        _ask(self.engine, f"{self.tag}-{index}", QUESTIONS[index % len(QUESTIONS)])

    def _keep(self, finished: ReplyFinished) -> None:
        question = QUESTIONS[int(finished.request_id.rsplit("-", 1)[1]) % len(QUESTIONS)]
        if self.texts.setdefault(question, finished.text) != finished.text:
            self.differing.append(finished.request_id)


@pytest.fixture(scope="module")
def built_in(default_model_path, engine_driver):
    """A real engine thread with the built-in model loaded in fp32, whose greedy replies do not depend on which
    other rows share a step or how a prompt was split into chunks (the 4-bit kernels' rounding does)."""
    engine = engine_driver()
    engine.thread.submit(LoadModel("load", str(default_model_path), FP32))
    assert isinstance(engine.wait_for(ModelLoaded, LoadFailed), ModelLoaded)
    yield engine
    engine.thread.stop()


def test_requests_are_answered_within_a_few_steps_while_eight_replies_stream(built_in, default_model_path) -> None:
    plain = Streams(built_in, "plain")
    plain.run(total=STREAMS + 4)
    for conversation, question in (("forget-me", "Tell me about apples."), ("keep-me", "Tell me about pears.")):
        _ask(built_in, conversation, question, SamplingParams(temperature=0, max_new_tokens=2))
        built_in.wait_for(ReplyFinished)

    mixed = Streams(built_in, "mixed")
    asked_at: dict[str, float] = {}

    def interleave(ended: int) -> None:
        if ended != 2:
            return
        path = str(default_model_path)
        for request in (InspectModel("inspect", path), LoadModel("reload", path, FP32)):
            asked_at[request.request_id] = time.perf_counter()
            built_in.thread.submit(request)
        asked_at["forget"] = time.perf_counter()
        built_in.thread.submit(ForgetConversation("forget-me"))
        _ask(built_in, "forget-again", "Tell me about apples.", SamplingParams(temperature=0, max_new_tokens=2),
             conversation="forget-me")
        _ask(built_in, "keep-again", "Tell me about pears.", SamplingParams(temperature=0, max_new_tokens=2),
             conversation="keep-me")

    mixed.run(total=STREAMS + 4, on_ended=interleave)
    inspected = mixed.wait_for((ModelInspected, InspectFailed), "inspect")
    load_began = next(e for e in mixed.events if getattr(e, "request_id", "") == "reload")
    forgotten, kept = mixed.wait_for(PrefillDone, "forget-again"), mixed.wait_for(PrefillDone, "keep-again")
    assert isinstance(mixed.wait_for((ModelLoaded,), "reload"), ModelLoaded)

    assert isinstance(inspected, ModelInspected)
    for request_id, answer in (("inspect", inspected), ("reload", load_began), ("forget", forgotten)):
        assert mixed.tokens_between(asked_at[request_id], answer) <= MOST_STEPS * STREAMS, request_id
    assert kept.reused_tokens == kept.prompt_tokens - 1
    assert forgotten.reused_tokens < forgotten.prompt_tokens - 4, "the forgotten conversation's own tokens were gone"
    assert not plain.differing and not mixed.differing
    assert mixed.texts == plain.texts, "the replies say what they say without the requests in between"
    _ask(built_in, "after-reload", QUESTIONS[0])
    assert built_in.wait_for(ReplyFinished).text == plain.texts[QUESTIONS[0]], "the reloaded model says the same"


def test_shutdown_during_eight_replies_ends_every_reply_within_a_step(built_in) -> None:
    streams = Streams(built_in, "shutdown")
    long_reply = SamplingParams(temperature=0, max_new_tokens=400)
    for index, question in enumerate(QUESTIONS):
        _ask(built_in, f"shutdown-{index}", question, long_reply)
    while sum(isinstance(e, TokenStreamed) for e in streams.events) < 3 * STREAMS:
        streams.next_event()
    step_s = statistics.median(_step_gaps(streams.events))

    started = time.perf_counter()
    built_in.thread.stop()
    stopped_s = time.perf_counter() - started
    while not built_in.events.empty():
        streams.events.append(built_in.events.get())

    assert not built_in.thread.alive
    assert stopped_s < 3 * step_s + 1.0, f"stopped in {stopped_s:.2f} s; a step takes {step_s:.2f} s"
    ends = {e.request_id for e in streams.events if isinstance(e, (ReplyFinished, ReplyFailed))}
    assert ends >= {f"shutdown-{index}" for index in range(STREAMS)}, "every reply got its end event"


def _step_gaps(events: list) -> list[float]:
    """Seconds between two tokens of one reply: one step each."""
    last: dict[str, float] = {}
    gaps = []
    for event in events:
        if isinstance(event, TokenStreamed):
            if event.request_id in last:
                gaps.append(event.timestamp - last[event.request_id])
            last[event.request_id] = event.timestamp
    return gaps


def test_the_transformers_fallback_answers_an_inspection_while_it_streams(tiny_model_dir, engine_driver) -> None:
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("hf", str(tiny_model_dir), LoadOptions(device="cpu", precision="bf16")))
        loaded = engine.wait_for(ModelLoaded)
        assert ONE_AT_A_TIME_NOTICE in loaded.notices, "bf16 on the CPU runs through transformers"
        _ask(engine, "long", "Tell me about the quick brown fox", SamplingParams(temperature=0, max_new_tokens=300))
        engine.wait_for(TokenStreamed)
        engine.thread.submit(InspectModel("inspect", str(tiny_model_dir)))
        seen = [engine.wait_for(ModelInspected, InspectFailed, TokenStreamed, ReplyFinished)]
        while not isinstance(seen[-1], ReplyFinished):
            seen.append(engine.wait_for(ModelInspected, InspectFailed, TokenStreamed, ReplyFinished))
    finally:
        engine.thread.stop()
    answer = next(e for e in seen if isinstance(e, (ModelInspected, InspectFailed)))
    assert isinstance(answer, ModelInspected)
    assert sum(isinstance(e, TokenStreamed) for e in seen[seen.index(answer):]) >= 10, "the reply streamed on after it"


def test_a_step_that_fails_ends_every_running_reply_and_the_engine_goes_on(engine, monkeypatch) -> None:
    from engine.service.batch_runner import BatchRunner

    real_step = BatchRunner.step
    steps = []

    def failing_step(self, memory) -> None:
        real_step(self, memory)
        steps.append(1)
        if len(steps) == 3:  # the prompts are in, the replies have said a token or two
            raise RuntimeError("the scheduler lost its place")

    monkeypatch.setattr(BatchRunner, "step", failing_step)
    for index in range(3):
        _ask(engine, f"crash-{index}", QUESTIONS[index], SamplingParams(temperature=0, max_new_tokens=30))
    ended = [engine.wait_for(EngineError, ReplyFailed) for _ in range(4)]
    failed = [e for e in ended if isinstance(e, ReplyFailed)]
    assert any(isinstance(e, EngineError) and "the scheduler lost its place" in e.message for e in ended)
    assert {f.request_id for f in failed} == {f"crash-{index}" for index in range(3)}
    assert all(f.message.startswith(ENGINE_FAILURE) for f in failed)
    assert engine.ask("after-crash", [ChatMessage("user", "Hi")]).reply.stats.tokens_generated > 0
