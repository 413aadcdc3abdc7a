"""Full garbage collections wait for quiet moments: never started by Python mid-scroll or mid-reply."""

from __future__ import annotations

import gc
import threading

import pytest
from PySide6.QtCore import QObject, Signal

from app.window.quiet_gc import QuietCollector
from engine.host import garbage


class Moments(QObject):
    reply_finished = Signal(object)


@pytest.fixture
def full_collections():
    """Counts full (generation 2) collections while the test runs; Python's own thresholds come back after."""
    seen: list[int] = []

    def note(phase, info):
        if phase == "stop" and info["generation"] == 2:
            seen.append(1)

    gc.callbacks.append(note)
    yield seen
    gc.callbacks.remove(note)
    gc.enable()


def _churn(cycles: int) -> None:
    """Objects that survive young collections, as a long conversation's cards do, then become garbage."""
    kept = []
    for index in range(cycles):
        node: dict = {"index": index}
        node["self"] = node  # a cycle: only the collector can free it
        kept.append(node)
    kept.clear()


def test_python_starts_no_full_collection_while_the_app_is_busy(qtbot, full_collections):
    collector = QuietCollector((), after_ms=10, every_ms=60_000)
    full_collections.clear()  # the start-up collection
    _churn(300_000)
    assert full_collections == []
    collector.stop()
    _churn(300_000)
    assert full_collections, "with Python's thresholds back, full collections happen again"


def test_a_quiet_moment_brings_one_full_collection_soon_after(qtbot, full_collections):
    moments = Moments()
    collector = QuietCollector((moments.reply_finished,), after_ms=20, every_ms=60_000)
    full_collections.clear()
    moments.reply_finished.emit(object())
    moments.reply_finished.emit(object())  # a second reply inside the delay: still one collection
    qtbot.waitUntil(lambda: len(full_collections) >= 1, timeout=2000)
    qtbot.wait(100)
    assert len(full_collections) == 1
    collector.stop()


def test_a_long_quiet_stretch_still_gets_its_collection(qtbot, full_collections):
    collector = QuietCollector((), after_ms=10, every_ms=50)
    full_collections.clear()
    qtbot.waitUntil(lambda: len(full_collections) >= 2, timeout=2000)
    collector.stop()


def test_collections_run_on_the_gui_thread_whichever_thread_made_the_garbage(qtbot):
    """A Qt object in a cycle must not be destroyed off the GUI thread: no thread but it collects."""
    threads: list[str] = []

    def note(phase, info):
        if phase == "start":
            threads.append(threading.current_thread().name)

    collector = QuietCollector((), after_ms=60_000, every_ms=60_000)
    gc.callbacks.append(note)
    try:
        worker = threading.Thread(target=_churn, args=(300_000,), name="engine-like")
        worker.start()
        worker.join()
        qtbot.waitUntil(lambda: threads != [], timeout=2000)
    finally:
        gc.callbacks.remove(note)
        collector.stop()
    assert set(threads) == {threading.current_thread().name}
    assert gc.isenabled()


def test_the_engines_own_full_collections_run_on_the_gui_thread_while_it_waits(qtbot):
    """After a model swap the engine thread asks for a full collection (``engine.host.garbage``): the app runs it."""
    full_collections_by_thread: list[str] = []

    def note(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_collections_by_thread.append(threading.current_thread().name)

    collector = QuietCollector((), after_ms=60_000, every_ms=60_000)
    asked: list[bool] = []
    gc.callbacks.append(note)
    try:
        engine_like = threading.Thread(target=lambda: asked.append(garbage.collect()), name="engine-like")
        engine_like.start()
        qtbot.waitUntil(lambda: asked != [], timeout=garbage.HOST_WAIT_S * 1000)
        engine_like.join()
        while_the_app_runs = list(full_collections_by_thread)
        collector.stop()
        full_collections_by_thread.clear()
        after_stop = threading.Thread(target=garbage.collect, name="engine-like")
        after_stop.start()
        after_stop.join()
    finally:
        gc.callbacks.remove(note)
        collector.stop()
    assert asked == [True] and set(while_the_app_runs) == {threading.current_thread().name}
    assert full_collections_by_thread == ["engine-like"], "once the app stops, the engine collects on its own thread"
