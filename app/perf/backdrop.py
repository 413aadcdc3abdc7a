"""What a widget's ancestors paint behind it, kept as a pixmap (GUI thread).

A widget that paints every one of its pixels can say so (``WA_OpaquePaintEvent``),
and then Qt repaints only it, not the group box and panel behind it, each time
it changes. To still look see-through, such a widget first draws its
``Backdrop``: its ancestors' own painting (window background, group box frame)
under its rectangle, rendered again only when it moves or is resized.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QPainter, QPixmap, QRegion
from PySide6.QtWidgets import QWidget


def painting_ancestors(widget: QWidget) -> list[QWidget]:
    """The parents up to the first one that fills its background (or the window), outermost first."""
    ancestors = []
    parent = widget.parentWidget()
    while parent is not None:
        ancestors.append(parent)
        if parent.autoFillBackground() or parent.isWindow():
            break
        parent = parent.parentWidget()
    return ancestors[::-1]


class Backdrop:
    """The pixels behind ``widget``, rendered once per position, size and pixel ratio."""

    def __init__(self, widget: QWidget) -> None:
        self._widget = widget
        self._key: tuple | None = None
        self._pixmap = QPixmap()

    def invalidate(self) -> None:
        """Render again at the next ``pixmap`` call (the palette or style changed)."""
        self._key = None

    def pixmap(self) -> QPixmap:
        widget = self._widget
        key = (widget.mapTo(widget.window(), QPoint(0, 0)), widget.size(), widget.devicePixelRatioF())
        if key != self._key:
            self._key = key
            self._pixmap = self._render()
        return self._pixmap

    def _render(self) -> QPixmap:
        widget = self._widget
        ratio = widget.devicePixelRatioF()
        pixmap = QPixmap(round(widget.width() * ratio), round(widget.height() * ratio))
        pixmap.setDevicePixelRatio(ratio)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        for depth, ancestor in enumerate(painting_ancestors(widget)):
            under = QRegion(QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size()))
            flags = QWidget.RenderFlag.DrawWindowBackground if depth == 0 else QWidget.RenderFlag(0)
            ancestor.render(painter, QPoint(0, 0), under, flags)
        painter.end()
        return pixmap
