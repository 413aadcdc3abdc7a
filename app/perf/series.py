"""A time series that keeps only the last few minutes, for the live charts.

Pure Python, no Qt; it is written and read on the GUI thread. Adding a point is
O(1) amortised: points closer together than ``resolution_s`` replace the previous
one (the chart cannot show them apart anyway), and points older than
``window_s`` behind the newest are dropped from the front.
"""

from __future__ import annotations

import collections
from typing import NamedTuple


class Point(NamedTuple):
    """One sample: engine-clock seconds, the value, and whether a new line starts here."""

    time: float
    value: float
    starts_run: bool = False


class RollingSeries:
    """The newest samples of one figure, at most ``window_s`` seconds of them."""

    def __init__(self, window_s: float = 300.0, resolution_s: float = 0.2) -> None:
        self.window_s = window_s
        self.resolution_s = resolution_s
        self._points: collections.deque[Point] = collections.deque()
        self._next_starts_run = True

    def add(self, time: float, value: float) -> None:
        """Record ``value`` at engine time ``time`` (seconds, monotonic)."""
        starts_run = self._next_starts_run
        self._next_starts_run = False
        last = self._points[-1] if self._points else None
        if last is not None and not starts_run and time - last.time < self.resolution_s:
            self._points[-1] = Point(last.time, value, last.starts_run)
        else:
            self._points.append(Point(time, value, starts_run))
        self._drop_older_than(time - self.window_s)

    def break_line(self) -> None:
        """The next point starts a new line (e.g. a new reply: no line across the pause)."""
        self._next_starts_run = True

    def points(self) -> list[Point]:
        return list(self._points)

    def latest(self) -> Point | None:
        return self._points[-1] if self._points else None

    def __len__(self) -> int:
        return len(self._points)

    def _drop_older_than(self, oldest: float) -> None:
        while self._points and self._points[0].time < oldest:
            self._points.popleft()
