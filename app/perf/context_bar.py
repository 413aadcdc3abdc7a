"""Context fill: tokens in use against the model's context length, as a bar (GUI thread)."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar, QWidget

from app.perf.format import format_count

_STEPS = 1000
_WARN_FRACTION = 0.9
_OK_COLOR = "#6aa84f"
_FULL_COLOR = "#cc4125"
_STYLE = (
    "QProgressBar {{ border: 1px solid palette(mid); border-radius: 3px; text-align: center; }}"
    " QProgressBar::chunk {{ background-color: {color}; border-radius: 2px; }}"
)


def context_text(in_use: int, context_length: int) -> str:
    """``1,234 / 4,096 tokens (30 %)``."""
    percent = 100 * in_use / context_length if context_length > 0 else 0.0
    return f"{format_count(in_use)} / {format_count(context_length)} tokens ({percent:.0f} %)"


class ContextBar(QProgressBar):
    """A progress bar that fills with the conversation's tokens; turns red near full."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("context_bar")
        self.setRange(0, _STEPS)
        self.setTextVisible(True)
        self._chunk_color = ""
        self.show_fill(None, None)

    def show_fill(self, in_use: int | None, context_length: int | None) -> None:
        if in_use is None or not context_length:
            self.setValue(0)
            self.setFormat("no conversation yet")
            self._set_chunk_color(_OK_COLOR)
            return
        fraction = min(in_use / context_length, 1.0)
        self.setValue(round(fraction * _STEPS))
        self.setFormat(context_text(in_use, context_length))
        self._set_chunk_color(_FULL_COLOR if fraction >= _WARN_FRACTION else _OK_COLOR)

    def _set_chunk_color(self, color: str) -> None:
        if color == self._chunk_color:
            return  # restyling is costly; the bar is refreshed up to ten times a second
        self._chunk_color = color
        self.setStyleSheet(_STYLE.format(color=color))
