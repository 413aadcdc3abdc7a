"""The dock that holds the performance panel in the main window (GUI thread).

The window adds it with ``addDockWidget`` and puts ``toggleViewAction()`` (text
"Performance") in its View menu. The panel sits in a scroll area so a short
dock still reaches every figure; while the dock is closed or tabbed away the
panel is hidden and does no refresh work.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QScrollArea, QWidget

from app.perf.panel import PerformancePanel


class PerformanceDock(QDockWidget):
    """Dockable "Performance" window around a ``PerformancePanel`` (``self.panel``)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Performance", parent)
        self.setObjectName("performance_dock")
        self.setAllowedAreas(Qt.DockWidgetArea.LeftDockWidgetArea | Qt.DockWidgetArea.RightDockWidgetArea)
        self.panel = PerformancePanel()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.panel)
        self.setWidget(scroll)
        self.toggleViewAction().setText("Performance")
        self.toggleViewAction().setStatusTip("Show or hide the live performance panel")
