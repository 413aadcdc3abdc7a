"""Full garbage collections only at quiet moments (GUI thread).

A full collection walks every tracked Python object while holding the GIL. With a
long conversation's cards alive that takes long enough to be seen when it
lands mid-scroll or mid-reply, and Python starts one by itself whenever enough
objects have survived younger collections. ``QuietCollector`` turns that trigger off
and collects fully itself: at start-up, a moment after each reply or model load ends
(the user is reading), and every few minutes as a safety net. Young collections stay
automatic: they are short. What lives as long as the app is frozen out of the
collector's sight at start-up (``gc.freeze``), which keeps the quiet collections short too.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer, SignalInstance

NEVER = 2**31 - 1
"""Younger collections to count before Python would start a full one: never, in practice."""
AFTER_QUIET_MS = 1000
SAFETY_NET_MS = 5 * 60 * 1000


def _freeze_long_lived_objects() -> None:
    """Take what lives as long as the app (modules, Qt bindings, the window) out of the collector's sight."""
    gc.collect()
    gc.freeze()


class QuietCollector(QObject):
    """Owns when full collections happen, from construction until ``stop()``."""

    def __init__(self, quiet_moments: tuple[SignalInstance, ...], parent: QObject | None = None,
                 after_ms: int = AFTER_QUIET_MS, every_ms: int = SAFETY_NET_MS) -> None:
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, NEVER)
        _freeze_long_lived_objects()
        self._soon = QTimer(self, singleShot=True, interval=after_ms)
        self._soon.timeout.connect(gc.collect)
        self._safety_net = QTimer(self, interval=every_ms)
        self._safety_net.timeout.connect(gc.collect)
        self._safety_net.start()
        for signal in quiet_moments:
            signal.connect(self._soon.start)

    def stop(self) -> None:
        """Hand full collections back to Python."""
        self._soon.stop()
        self._safety_net.stop()
        gc.set_threshold(*self._thresholds)
