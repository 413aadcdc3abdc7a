"""A model load runs beside the engine: the old model keeps answering, and a load can be cancelled."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from engine.models.loading import LoadCancelled
from engine.protocol.messages import (
    Cancel,
    ChatMessage,
    Generate,
    LoadFailed,
    LoadModel,
    LoadProgress,
    ModelLoaded,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service import background_load


@pytest.fixture
def slow_loads(monkeypatch):
    """Loads of paths starting with "slow:" report progress, then wait until cancelled; loads of "gated:FOLDER"
    load FOLDER, then end once ``slow_loads.gate`` is set. ``slow_loads.started`` is set when a slow load began or
    a gated one waits at its gate."""
    real_open = background_load.open_model
    loads = SimpleNamespace(started=threading.Event(), gate=threading.Event())

    def open_model(path, options, emit, progress, is_cancelled):
        if path.startswith("gated:"):
            loaded = real_open(path.removeprefix("gated:"), options, emit, progress, is_cancelled)
            loads.started.set()
            loads.gate.wait(60)
            return loaded
        if not path.startswith("slow:"):
            return real_open(path, options, emit, progress, is_cancelled)
        progress(1, 3)
        loads.started.set()
        while not is_cancelled():
            threading.Event().wait(0.01)
        raise LoadCancelled()

    monkeypatch.setattr(background_load, "open_model", open_model)
    return loads


def test_old_model_answers_during_a_load_and_stays_after_cancel(tiny_model_dir, slow_loads, engine_driver) -> None:
    engine = engine_driver()
    try:
        assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
        engine.thread.submit(LoadModel("slow-load", "slow:big-model"))
        assert isinstance(engine.wait_for(LoadProgress), LoadProgress)
        assert slow_loads.started.wait(10)
        during = engine.ask("conv", [ChatMessage("user", "Hi")])
        assert isinstance(during.reply, ReplyFinished)
        engine.thread.submit(Cancel("slow-load"))
        failed = engine.wait_for(LoadFailed)
        assert failed.request_id == "slow-load" and "cancelled" in failed.message
        after = engine.ask("conv", [ChatMessage("user", "Hi")])
        assert after.reply.text == during.reply.text
    finally:
        engine.thread.stop()


def test_a_newer_load_replaces_one_in_flight(tiny_model_dir, slow_loads, engine_driver) -> None:
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("first", "slow:model"))
        assert slow_loads.started.wait(10)
        engine.thread.submit(LoadModel("second", str(tiny_model_dir)))
        superseded = engine.wait_for(LoadFailed)
        assert superseded.request_id == "first"
        loaded = engine.wait_for(ModelLoaded)
        assert loaded.request_id == "second"
    finally:
        engine.thread.stop()


def test_a_reply_asked_before_the_first_model_is_loaded_waits_for_it(tiny_model_dir, engine_driver) -> None:
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("first-load", str(tiny_model_dir)))
        turn = engine.ask("early", [ChatMessage("user", "Hi")])
        assert turn.reply.stats.tokens_generated > 0
    finally:
        engine.thread.stop()


def test_a_reply_waiting_for_a_load_fails_with_the_loads_message(slow_loads, engine_driver) -> None:
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("slow-load", "slow:big-model"))
        engine.thread.submit(Generate("early", "conv", (ChatMessage("user", "Hi"),)))
        assert slow_loads.started.wait(10)
        engine.thread.submit(Cancel("slow-load"))
        failed = engine.wait_for(ReplyFailed)
        assert failed.request_id == "early" and "cancelled" in failed.message
    finally:
        engine.thread.stop()


def test_replies_running_when_a_load_ends_finish_on_the_old_model_before_it_swaps(
        tiny_model_dir, tiny_loaded, slow_loads, engine_driver, reply_alone) -> None:
    engine = engine_driver()
    sampling = SamplingParams(temperature=0, max_new_tokens=60)
    messages = {f"old-{i}": (ChatMessage("user", f"Tell me about the fox, number {i}"),) for i in range(4)}
    try:
        assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
        engine.thread.submit(LoadModel("new-model", f"gated:{tiny_model_dir}"))
        assert slow_loads.started.wait(10)
        for request_id, chat in messages.items():
            engine.thread.submit(Generate(request_id, request_id, chat, sampling))
        seen = [engine.wait_for(TokenStreamed)]
        slow_loads.gate.set()  # the new model is ready while the four replies run
        for loader in [t for t in threading.enumerate() if t.name == "hearth-loader"]:
            loader.join(30)  # it posted its LoadDone
        engine.thread.submit(Generate("new-0", "new-0", messages["old-0"], sampling))
        while not isinstance(seen[-1], ModelLoaded):
            seen.append(engine.wait_for(ModelLoaded, ReplyFinished, ReplyFailed))
        seen.append(engine.wait_for(ReplyFinished, ReplyFailed))
    finally:
        engine.thread.stop()
    ends = [e.request_id for e in seen if isinstance(e, (ReplyFinished, ReplyFailed))]
    swapped = next(index for index, event in enumerate(seen) if isinstance(event, ModelLoaded))
    assert set(ends[:4]) == set(messages) and ends[4:] == ["new-0"]
    assert not any(isinstance(e, ReplyFailed) for e in seen), "no reply failed"
    assert max(seen.index(e) for e in seen if getattr(e, "request_id", "").startswith("old")) < swapped, (
        "the old replies end before the new model takes over; the one asked meanwhile runs on the new model")
    ends = {e.request_id: e for e in seen if isinstance(e, ReplyFinished)}
    for request_id, chat in messages.items():
        prompt = tiny_loaded.tokenize(tiny_loaded.render(chat))
        assert ends[request_id].text == reply_alone(tiny_loaded, prompt, sampling).text
    assert ends["new-0"].text == ends["old-0"].text


def test_a_reply_waiting_for_a_load_can_be_cancelled_and_the_load_goes_on(slow_loads, engine_driver) -> None:
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("slow-load", "slow:big-model"))
        engine.thread.submit(Generate("early", "conv", (ChatMessage("user", "Hi"),)))
        engine.thread.submit(Cancel("early"))
        failed = engine.wait_for(ReplyFailed)
        assert failed.request_id == "early" and "cancelled while it waited" in failed.message
        assert slow_loads.started.wait(10)
        engine.thread.submit(Cancel("slow-load"))
        assert engine.wait_for(LoadFailed).request_id == "slow-load"
    finally:
        engine.thread.stop()
