"""Fixtures shared by the storage tests: a controllable clock and a store in a temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage import ChatStore


class FakeClock:
    """Unix time that moves only when told to (one second per reading by default)."""

    def __init__(self, start: float = 1_800_000_000.0, step: float = 1.0) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "hearth.sqlite3"


@pytest.fixture
def store(db_path: Path, clock: FakeClock) -> Iterator[ChatStore]:
    opened = ChatStore.open(db_path, clock=clock)
    yield opened
    opened.close()
