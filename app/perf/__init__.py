"""The live performance panel (View > Performance): figures, plots and a stage timeline.

GUI thread only. The main window docks ``PerformanceDock`` and forwards every
engine event to ``dock.panel.on_event``, and tells it which conversation is on
screen and which conversation each reply answers; ``PerfState`` is the Qt-free
model behind it. ``bench`` holds the GUI benchmarks, commands run in a process of their own.
"""

from app.perf.dock import PerformanceDock
from app.perf.panel import PerformancePanel
from app.perf.state import PerfState

__all__ = ["PerfState", "PerformanceDock", "PerformancePanel"]
