"""Fixtures of the engine-thread tests: the tiny model loaded on a real engine thread (test thread + engine thread)."""

from __future__ import annotations

import pytest

from engine.protocol.messages import ModelLoaded


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_driver):
    """One engine thread per test module, with the tiny random Llama loaded."""
    engine = engine_driver()
    assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
    yield engine
    engine.thread.stop()
