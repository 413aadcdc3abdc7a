"""A model load runs beside the engine: the old model keeps answering, and a load can be cancelled."""

from __future__ import annotations

import threading

import pytest

from engine.models.loading import LoadCancelled
from engine.protocol.messages import (
    Cancel,
    ChatMessage,
    LoadFailed,
    LoadModel,
    LoadProgress,
    ModelLoaded,
    ReplyFinished,
)
from engine.service import background_load


@pytest.fixture
def slow_loads(monkeypatch):
    """Loads of paths starting with "slow:" report progress, then wait until cancelled."""
    real_open = background_load.open_model
    started = threading.Event()

    def open_model(path, options, emit, progress, is_cancelled):
        if not path.startswith("slow:"):
            return real_open(path, options, emit, progress, is_cancelled)
        progress(1, 3)
        started.set()
        while not is_cancelled():
            threading.Event().wait(0.01)
        raise LoadCancelled()

    monkeypatch.setattr(background_load, "open_model", open_model)
    return started


def test_old_model_answers_during_a_load_and_stays_after_cancel(tiny_model_dir, slow_loads, engine_driver) -> None:
    engine = engine_driver()
    try:
        assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
        engine.thread.submit(LoadModel("slow-load", "slow:big-model"))
        assert isinstance(engine.wait_for(LoadProgress), LoadProgress)
        assert slow_loads.wait(10)
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
        assert slow_loads.wait(10)
        engine.thread.submit(LoadModel("second", str(tiny_model_dir)))
        superseded = engine.wait_for(LoadFailed)
        assert superseded.request_id == "first"
        loaded = engine.wait_for(ModelLoaded)
        assert loaded.request_id == "second"
    finally:
        engine.thread.stop()
