"""A one-line label that never widens its window: text too long is cut with "…" (GUI thread)."""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_WIDTH = 40


def plain_tooltip(text: str) -> str:
    """``text`` as a tooltip shown as typed: Qt would render a tooltip that looks like HTML as HTML."""
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>" if text else ""


class ElidedLabel(QLabel):
    """Plain text only (never rich text, whoever wrote it); asks for little width, shows "…" where cut, placed
    left or right as its alignment says.

    The tooltip holds the whole text, and ``details`` after it when given.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.set_text(text)

    def set_text(self, text: str, details: str = "") -> None:
        self.setText(text)
        self.setToolTip(plain_tooltip("\n".join(part for part in (text, details) if part)))

    def minimumSizeHint(self) -> QSize:
        return QSize(MIN_WIDTH, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self.text()) + 8, super().sizeHint().height())

    def text_left(self) -> int:
        """Where the drawn text begins, in this label's coordinates."""
        area = self.contentsRect()
        if not self.alignment() & Qt.AlignmentFlag.AlignRight:
            return area.left()
        return area.right() + 1 - min(self.fontMetrics().horizontalAdvance(self.text()), area.width())

    def paintEvent(self, _event: QPaintEvent) -> None:
        area = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, area.width())
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        horizontal = self.alignment() & Qt.AlignmentFlag.AlignHorizontal_Mask
        painter.drawText(area, horizontal | Qt.AlignmentFlag.AlignVCenter, shown)
