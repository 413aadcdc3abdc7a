"""Garbage collections on the GUI thread alone, the full ones only at quiet moments (GUI thread).

Python collects on whichever thread happens to allocate past a threshold: the engine
thread, asyncio's child watchers, a worker importing the MCP SDK. A Qt object caught in
a reference cycle would then be destroyed off the GUI thread, which Qt does not allow
(a timer left behind crashes the next timer event). So ``QuietCollector`` turns Python's
own collections off and runs them from a GUI-thread timer: a young collection
whenever Python would have started one, checked every ``YOUNG_CHECK_MS``. The full
collections the engine thread asks for (``engine.host.garbage``: the old model's
objects after a swap) run here too, while the engine thread waits.

A full collection walks every tracked Python object while holding the GIL. With a
long conversation's cards alive that takes long enough to be seen when it lands
mid-scroll or mid-reply, so full collections come at start-up, a moment after each
reply or model load ends (the user is reading), and every few minutes as a safety net.
What lives as long as the app is frozen out of the collector's sight at start-up
(``gc.freeze``), which keeps the quiet collections short too.
"""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QObject, QThread, QTimer, Signal, SignalInstance

from engine.host import garbage

AFTER_QUIET_MS = 1000
YOUNG_CHECK_MS = 200
SAFETY_NET_MS = 5 * 60 * 1000


def _freeze_long_lived_objects() -> None:
    """Take what lives as long as the app (modules, Qt bindings, the window) out of the collector's sight."""
    gc.collect()
    gc.freeze()


class QuietCollector(QObject):
    """Owns when full collections happen, from construction until ``stop()``."""

    _asked = Signal(object)  # a threading.Event to set once a full collection ran (queued from another thread)

    def __init__(self, quiet_moments: tuple[SignalInstance, ...], parent: QObject | None = None,
                 after_ms: int = AFTER_QUIET_MS, every_ms: int = SAFETY_NET_MS) -> None:
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        gc.disable()
        _freeze_long_lived_objects()
        self._young = QTimer(self, interval=YOUNG_CHECK_MS)
        self._young.timeout.connect(self._collect_young)
        self._young.start()
        self._soon = QTimer(self, singleShot=True, interval=after_ms)
        self._soon.timeout.connect(gc.collect)
        self._safety_net = QTimer(self, interval=every_ms)
        self._safety_net.timeout.connect(gc.collect)
        self._safety_net.start()
        for signal in quiet_moments:
            signal.connect(self._soon.start)
        self._asked.connect(self._collect_asked)
        garbage.hand_to(self.collect_from_any_thread)
        self.destroyed.connect(lambda: garbage.hand_to(None))

    def collect_from_any_thread(self, timeout_s: float) -> bool:
        """A full collection on the GUI thread; from another thread, waits up to ``timeout_s`` for it. Whether it
        ran."""
        if QThread.currentThread() is self.thread():
            gc.collect()
            return True
        done = threading.Event()
        self._asked.emit(done)
        return done.wait(timeout_s)

    @staticmethod
    def _collect_asked(done: threading.Event) -> None:
        gc.collect()
        done.set()

    def _collect_young(self) -> None:
        """The young collection Python would have started by now, if any: generation 1 where enough generation-0
        collections have passed, else generation 0."""
        young_count, middle_count, _ = gc.get_count()
        young, middle, _ = self._thresholds
        if young_count > young:
            gc.collect(1 if middle_count >= middle else 0)

    def stop(self) -> None:
        """Hand collections back to Python, first collecting here what became garbage since the last collection:
        left to Python, it would be collected by whichever thread allocates next."""
        garbage.hand_to(None)
        self._young.stop()
        self._soon.stop()
        self._safety_net.stop()
        gc.collect()
        gc.enable()
