"""The performance panel, shown offscreen at the width it has when docked, tall enough to show every part."""

from __future__ import annotations

import pytest

from app.perf.panel import PerformancePanel


@pytest.fixture
def panel(qtbot):
    widget = PerformancePanel()
    qtbot.addWidget(widget)
    widget.resize(440, 1100)
    widget.show()
    qtbot.waitExposed(widget)
    return widget
