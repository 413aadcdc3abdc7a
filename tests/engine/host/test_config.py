"""The engine's two user settings, read from the environment into one object."""

from __future__ import annotations

from pathlib import Path

from engine.host.config import EngineConfig
from engine.host.cpu_threads import engine_threads


def test_home_and_threads_come_from_the_environment():
    config = EngineConfig.from_environment({"HEARTH_HOME": "/data/hearth", "HEARTH_THREADS": "6"})
    assert config == EngineConfig(Path("/data/hearth"), 6)
    assert engine_threads(config) == 6


def test_unset_or_unusable_values_leave_the_defaults():
    assert EngineConfig.from_environment({}) == EngineConfig(None, None)
    assert EngineConfig.from_environment({"HEARTH_HOME": "", "HEARTH_THREADS": "0"}) == EngineConfig(None, None)
    assert EngineConfig.from_environment({"HEARTH_THREADS": "many"}).threads is None
    assert engine_threads(EngineConfig()) >= 1  # one per physical core
