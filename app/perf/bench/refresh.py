"""GUI-thread CPU the open performance panel costs while a reply streams (no engine, no model).

    python -m app.perf.bench.refresh --json [--tokens 500] [--rate 30] [--side open|closed|both] [--batch]

Runs on the GUI thread of its own QApplication (offscreen unless
``QT_QPA_PLATFORM`` says otherwise). A window like Hearth's, with the
performance dock at its usual width, is fed in real time the events an engine
would send: a model load, a reply of ``--tokens`` tokens at ``--rate`` tokens a
second, and a memory sample every second (with ``--batch``, also the ``BatchSampled``
a batching engine sends ten times a second). ``time.thread_time()`` of the GUI
thread over the stream, divided by the stream's length, is the cost per second
of streaming; the same run with the dock closed is the floor (the feeding
itself). Prints one JSON line per side and a summary line last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from PySide6.QtCore import QEventLoop, Qt, QTimer
from PySide6.QtWidgets import QApplication, QMainWindow, QTextEdit

from app.perf.dock import PerformanceDock
from engine.protocol.messages import (
    BatchSampled,
    Event,
    KVPoolStats,
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    PrefillDone,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)

DOCK_WIDTH = 380  # the main window's PERFORMANCE_DOCK_WIDTH
SETTLE_S = 0.3  # after the last event: the last refresh lands
GIB = 1024**3
BATCH_INTERVAL_S = 0.1


def memory_at(tokens: int) -> MemoryStats:
    kv = 40_000 * tokens
    return MemoryStats("cpu", int(0.1 * GIB), kv, kv, 6 * GIB + kv, 10 * GIB - kv, 16 * GIB, int(0.6 * GIB) + kv)


def batch_at(tokens: int, rate: float, at: float) -> BatchSampled:
    """Four replies running, one waiting, their KV blocks growing with the reply."""
    pool = KVPoolStats(16, 4096, 200 + tokens // 4, 30, 100, 16 * 40_000)
    return BatchSampled(4, 1, 4 * rate, pool, at)


def scripted_reply(start: float, tokens: int, rate: float, batch: bool = False) -> list[Event]:
    """Events of one reply with engine timestamps from ``start`` (seconds), in the order sent."""
    events: list[Event] = [PrefillDone("bench", 2.5, 120, 0, 180.0, 8192)]
    first_token_at, next_sample_at = start + 0.2, start + 1.0
    next_batch_at = first_token_at if batch else math.inf
    for index in range(1, tokens + 1):
        at = first_token_at + (index - 1) / rate
        if at >= next_sample_at:  # the engine samples memory about once a second
            events.append(MemorySampled(memory_at(index), at))
            next_sample_at += 1.0
        if at >= next_batch_at:
            events.append(batch_at(index, rate, at))
            next_batch_at += BATCH_INTERVAL_S
        speed = rate * (1 + 0.03 * math.sin(index / 7))  # the engine's figure drifts a little
        events.append(TokenStreamed("bench", "·", index, speed, at))
    last = first_token_at + (tokens - 1) / rate
    decode_ms = (last - first_token_at) * 1000
    stats = RequestStats(2.5, 120, 0, 180.0, 200.0, decode_ms, (tokens - 1) / (decode_ms / 1000), tokens, "max_tokens", 8192, (), memory_at(tokens), start, last)
    events.append(ReplyFinished("bench", "", stats))
    return events


def event_time(event: Event, start: float) -> float:
    if isinstance(event, (TokenStreamed, MemorySampled, BatchSampled)):
        return event.timestamp
    if isinstance(event, ReplyFinished):
        return event.stats.finished_at
    return start


def stream_in_real_time(dock: PerformanceDock, events: list[Event], start: float) -> None:
    """Hand each event to the panel when the wall clock reaches its timestamp."""
    loop = QEventLoop()
    timer = QTimer(singleShot=True, timerType=Qt.TimerType.PreciseTimer)
    pending = iter(events)
    upcoming: list[Event | None] = [next(pending, None)]

    def deliver() -> None:
        while upcoming[0] is not None and event_time(upcoming[0], start) <= time.monotonic():
            dock.panel.on_event(upcoming[0])
            upcoming[0] = next(pending, None)
        if upcoming[0] is None:
            QTimer.singleShot(round(SETTLE_S * 1000), loop.quit)
            return
        timer.start(max(0, round((event_time(upcoming[0], start) - time.monotonic()) * 1000)))

    timer.timeout.connect(deliver)
    timer.start(0)
    loop.exec()


def measure_side(window: QMainWindow, dock: PerformanceDock, panel_open: bool, args: argparse.Namespace) -> dict[str, Any]:
    dock.setVisible(panel_open)
    refreshes = []
    dock.panel.refreshed.connect(lambda: refreshes.append(1))
    QApplication.processEvents()
    start = time.monotonic() + 0.05
    events = scripted_reply(start, args.tokens, args.rate, args.batch)
    wall_before, cpu_before = time.monotonic(), time.thread_time()
    stream_in_real_time(dock, events, start)
    cpu_s, wall_s = time.thread_time() - cpu_before, time.monotonic() - wall_before
    dock.panel.refreshed.disconnect()
    return {
        "panel": "open" if panel_open else "closed",
        "stream_s": round(wall_s, 2),
        "gui_cpu_ms": round(cpu_s * 1000, 1),
        "gui_cpu_ms_per_s": round(cpu_s * 1000 / wall_s, 2),
        "refreshes": len(refreshes),
        "tokens": args.tokens,
    }


def build_window() -> tuple[QMainWindow, PerformanceDock]:
    window = QMainWindow()
    window.setCentralWidget(QTextEdit())
    dock = PerformanceDock(window)
    window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
    window.resize(1200, 800)
    window.resizeDocks([dock], [DOCK_WIDTH], Qt.Orientation.Horizontal)
    window.show()
    return window, dock


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    window, dock = build_window()
    dock.panel.on_event(ModelLoaded("load", "SmolLM2-135M-Instruct", "/models/smol", "cpu", "q4_1", 8192, 1.0, memory_at(0)))
    sides = {"open": (True,), "closed": (False,), "both": (True, False)}[args.side]
    rows = []
    for panel_open in sides:
        rows.append(measure_side(window, dock, panel_open, args))
        emit(rows[-1], args.json)
    window.close()
    return rows


def emit(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
    elif row.get("summary"):
        print(f"panel cost: {row['panel_cost_ms_per_s']} ms of GUI-thread CPU per second of streaming", flush=True)
    else:
        print(f"panel {row['panel']:>6}: {row['gui_cpu_ms_per_s']} ms CPU/s, {row['refreshes']} refreshes over {row['stream_s']} s", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.perf.bench.refresh", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=500, help="tokens in the streamed reply")
    parser.add_argument("--rate", type=float, default=30.0, help="tokens per second")
    parser.add_argument("--side", choices=("open", "closed", "both"), default="both", help="panel open, closed, or both")
    parser.add_argument("--batch", action="store_true", help="also the figures of a batching engine, 10 a second")
    parser.add_argument("--json", action="store_true", help="print JSON lines, a summary last")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication([sys.argv[0]])
    rows = run(args)
    if len(rows) == 2:
        cost = rows[0]["gui_cpu_ms_per_s"] - rows[1]["gui_cpu_ms_per_s"]
        emit({"summary": True, "panel_cost_ms_per_s": round(cost, 2)}, args.json)
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
