"""A small live line chart painted with QPainter: the last few minutes of one or more series.

Runs on the GUI thread. The chart only reads ``RollingSeries`` when it paints, so
feeding samples costs nothing here; the x axis is the engine's clock, with the
newest event at the right edge. The value axis starts at zero and ends at a
round number above the largest visible value. To stay cheap while a reply
streams, ``show_until`` repaints only once the time axis would move by a pixel
(so the newest sample may be drawn up to a pixel's worth of time late), and the
frame (axes, grid, labels, legend) is painted once per size and scale into a
pixmap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen, QPixmap, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.perf.series import Point, RollingSeries

_MANTISSAS = (1.0, 2.0, 2.5, 5.0)


@dataclass(frozen=True)
class ChartLine:
    """One series drawn on a chart, with its legend name and color."""

    name: str
    color: QColor
    series: RollingSeries


def nice_ceiling(value: float, base: int = 10) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k × base^n at or above ``value`` (base 1024 for bytes)."""
    if value <= 0:
        return 1.0
    scale = base ** math.floor(math.log(value, base))
    mantissa = value / scale
    candidates = [m * 10**k for k in range(4) for m in _MANTISSAS] + [float(base)]
    return min(c for c in candidates if c >= mantissa - 1e-9) * scale


class LineChart(QWidget):
    """Rolling line chart; call ``show_until`` with the engine time to (maybe) repaint."""

    MARGIN_LEFT = 58
    MARGIN_TOP = 20
    MARGIN_BOTTOM = 18

    def __init__(
        self,
        title: str,
        lines: list[ChartLine],
        format_value: Callable[[float], str],
        window_s: float,
        value_base: int = 10,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.title = title
        self.lines = lines
        self.format_value = format_value
        self.window_s = window_s
        self.value_base = value_base
        self.now: float | None = None
        self._frame: tuple[tuple[int, int, float, float], QPixmap] | None = None
        self.setMinimumHeight(110)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)  # the frame covers every pixel

    def show_until(self, now: float | None, force: bool = False) -> bool:
        """Put ``now`` at the right edge and repaint; unless forced, only once that moves the axis a pixel."""
        if not force and not self._axis_moves(now):
            return False
        self.now = now
        self.update()
        return True

    def _axis_moves(self, now: float | None) -> bool:
        if now is None or self.now is None:
            return now != self.now
        seconds_per_pixel = self.window_s / max(self.width() - self.MARGIN_LEFT - 8, 1)
        return abs(now - self.now) >= seconds_per_pixel

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._frame = None

    def value_top(self) -> float:
        """The value at the top of the plot: a round number above every visible sample."""
        visible = [p.value for line in self.lines for p in self._visible(line.series)]
        return nice_ceiling(max(visible, default=0.0), self.value_base)

    def paintEvent(self, event: QPaintEvent) -> None:
        plot = QRectF(
            self.MARGIN_LEFT,
            self.MARGIN_TOP,
            self.width() - self.MARGIN_LEFT - 8,
            self.height() - self.MARGIN_TOP - self.MARGIN_BOTTOM,
        )
        top = self.value_top()
        painter = QPainter(self)
        painter.drawPixmap(0, 0, self._frame_pixmap(plot, top))
        if self.now is not None:
            painter.setClipRect(plot)
            for line in self.lines:
                self._paint_line(painter, plot, top, line)
        painter.end()

    def _frame_pixmap(self, plot: QRectF, top: float) -> QPixmap:
        """The background, axes, grid, labels and legend for this size and scale, painted once."""
        ratio = self.devicePixelRatioF()
        key = (self.width(), self.height(), top, ratio)
        if self._frame is None or self._frame[0] != key:
            pixmap = QPixmap(round(self.width() * ratio), round(self.height() * ratio))
            pixmap.setDevicePixelRatio(ratio)
            pixmap.fill(self.palette().color(self.backgroundRole()))
            painter = QPainter(pixmap)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.setFont(self.font())
            self._paint_frame(painter, plot, top)
            painter.end()
            self._frame = (key, pixmap)
        return self._frame[1]

    def _paint_frame(self, painter: QPainter, plot: QRectF, top: float) -> None:
        text_color = self.palette().text().color()
        grid = QColor(text_color)
        grid.setAlpha(40)
        painter.fillRect(plot, self.palette().base())
        painter.setPen(text_color)
        painter.drawText(QRectF(0, 0, self.width(), self.MARGIN_TOP), Qt.AlignmentFlag.AlignLeft, self.title)
        self._paint_legend(painter)
        for fraction in (0.0, 0.5, 1.0):
            y = plot.bottom() - fraction * plot.height()
            painter.setPen(QPen(grid, 1))
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            painter.setPen(text_color)
            label_rect = QRectF(0, y - 8, self.MARGIN_LEFT - 6, 16)
            painter.drawText(label_rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, self.format_value(top * fraction))
        axis = QRectF(plot.left(), plot.bottom() + 2, plot.width(), self.MARGIN_BOTTOM)
        painter.drawText(axis, Qt.AlignmentFlag.AlignLeft, f"−{self.window_s / 60:g} min")
        painter.drawText(axis, Qt.AlignmentFlag.AlignRight, "now")

    def _paint_legend(self, painter: QPainter) -> None:
        metrics = painter.fontMetrics()
        x = float(self.width() - 8)
        for line in reversed(self.lines):
            x -= metrics.horizontalAdvance(line.name)
            painter.setPen(self.palette().text().color())
            painter.drawText(QPointF(x, metrics.ascent() + 1), line.name)
            x -= 14
            painter.fillRect(QRectF(x, metrics.ascent() - 8, 10, 10), line.color)
            x -= 12

    def _paint_line(self, painter: QPainter, plot: QRectF, top: float, line: ChartLine) -> None:
        shade = QColor(line.color)
        shade.setAlpha(45)
        for run in self._runs(self._visible(line.series)):
            polygon = self._to_plot(plot, top, run)
            area = QPolygonF(polygon)
            area.append(QPointF(polygon.last().x(), plot.bottom()))
            area.append(QPointF(polygon.first().x(), plot.bottom()))
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)  # a large fill: cheap unsmoothed
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(shade)
            painter.drawPolygon(area)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.setPen(QPen(line.color, 1.0))  # width 1 keeps Qt on its fast path for long lines
            if len(run) > 1:
                painter.drawPolyline(polygon)
            else:
                painter.drawPoint(polygon[0])

    def _to_plot(self, plot: QRectF, top: float, run: list[Point]) -> QPolygonF:
        assert self.now is not None
        right, bottom, now = plot.right(), plot.bottom(), self.now
        x_per_s = plot.width() / self.window_s
        y_per_value = plot.height() / top
        return QPolygonF(
            [QPointF(right - (now - time) * x_per_s, bottom - min(value, top) * y_per_value) for time, value, _ in run]
        )

    def _visible(self, series: RollingSeries) -> list[Point]:
        if self.now is None:
            return []
        oldest = self.now - self.window_s
        return [p for p in series.points() if p.time >= oldest]

    @staticmethod
    def _runs(points: list[Point]) -> list[list[Point]]:
        runs: list[list[Point]] = []
        for point in points:
            if point.starts_run or not runs:
                runs.append([])
            runs[-1].append(point)
        return runs
