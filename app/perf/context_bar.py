"""Context fill: tokens in use against the model's context length, as a bar (GUI thread).

The bar paints itself with a few fills instead of a style sheet: it changes with
every refresh while a reply streams, and style-sheet painting costs far more
each time.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QShowEvent
from PySide6.QtWidgets import QProgressBar, QWidget

from app.perf.backdrop import Backdrop
from app.perf.format import format_count

_STEPS = 1000
_WARN_FRACTION = 0.9
_OK_COLOR = QColor("#6aa84f")
_FULL_COLOR = QColor("#cc4125")


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
        self._backdrop = Backdrop(self)
        self._shown: tuple[int | None, int | None] | None = None
        self.show_fill(None, None)

    def show_fill(self, in_use: int | None, context_length: int | None) -> None:
        if (in_use, context_length) == self._shown:
            return
        self._shown = (in_use, context_length)
        if in_use is None or not context_length:
            self.setFormat("measured at this chat's next reply")  # none yet in this session, or none at all
            self.setValue(0)
            return
        self.setFormat(context_text(in_use, context_length))
        self.setValue(round(min(in_use / context_length, 1.0) * _STEPS))

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._mark_opaque()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.StyleChange:
            self._mark_opaque()
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            self._backdrop.invalidate()

    def _mark_opaque(self) -> None:
        """paintEvent covers every pixel (the backdrop first), so nothing behind the bar repaints with it.

        Set after the style polished the bar: styles clear this flag on progress bars.
        """
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)

    def chunk_color(self) -> QColor:
        return _FULL_COLOR if self.value() >= _WARN_FRACTION * _STEPS else _OK_COLOR

    def paintEvent(self, event: QPaintEvent) -> None:
        palette = self.palette()
        painter = QPainter(self)
        painter.drawPixmap(0, 0, self._backdrop.pixmap())
        frame = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        inside = QRectF(self.rect()).adjusted(2, 2, -2, -2)
        painter.fillRect(inside, palette.base())
        painter.fillRect(QRectF(inside.left(), inside.top(), inside.width() * self.value() / _STEPS, inside.height()), self.chunk_color())
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setPen(palette.mid().color())
        painter.drawRoundedRect(frame, 3, 3)
        painter.setPen(palette.text().color())
        painter.drawText(inside, Qt.AlignmentFlag.AlignCenter, self.format())
        painter.end()
