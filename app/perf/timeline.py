"""The stage timeline of one reply, drawn to scale: tokenize | prefill | decode loop.

``build_layout`` (pure, no Qt) turns a ``ReplyPerf`` into segments on one axis
of milliseconds; ``StageTimeline`` paints it on the GUI thread. The part of the
prompt found in the KV cache is drawn as a hatched "skipped" segment before the
prefill, as wide as prefilling those tokens would have taken at this reply's
measured prefill rate, capped at half the bar. It is a picture of work that was
*not* done, and is labelled so; it never enters any figure.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from PySide6.QtCore import QLineF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.perf.format import format_ms, format_tokens
from app.perf.state import ReplyPerf

STAGE_COLORS = {
    "tokenize": QColor("#8e7cc3"),
    "cached": QColor("#e69138"),
    "prefill": QColor("#e69138"),
    "decode": QColor("#3d85c6"),
}
CACHED_SHARE_WHEN_NO_RATE = 0.25


@dataclass(frozen=True)
class Segment:
    """One stage on the timeline axis; ``start`` and ``length`` in milliseconds."""

    kind: str
    start: float
    length: float

    @property
    def end(self) -> float:
        return self.start + self.length


@dataclass(frozen=True)
class TimelineLayout:
    """Segments and one tick per streamed token, all on the same millisecond axis.

    ``first_token`` is where the first token lands (the end of prefill until the
    engine reports the time to first token); the zoomed row ends there. The
    ticks are ``token_times`` (engine seconds) shifted so the first one sits
    at ``first_token``; they are not copied, as a reply may stream thousands.
    """

    segments: tuple[Segment, ...]
    span: float
    first_token: float
    token_times: Sequence[float]

    def segment(self, kind: str) -> Segment | None:
        return next((s for s in self.segments if s.kind == kind), None)

    @property
    def tick_count(self) -> int:
        return len(self.token_times)

    def tick_ms(self, index: int) -> float:
        return self.first_token + (self.token_times[index] - self.token_times[0]) * 1000

    def tick_columns(self, width: int, span: float) -> list[int]:
        """The pixel columns (of ``width`` showing ``span`` ms) that hold at least one tick.

        One binary search per column, so painting costs the same for ten tokens
        or ten thousand.
        """
        times = self.token_times
        if not times or span <= 0 or width <= 0:
            return []
        ms_per_px = span / width
        columns, seen = [], 0
        for x in range(width):
            column_end_ms = (x + 0.5) * ms_per_px if x < width - 1 else span * (1 + 1e-9)
            end = bisect.bisect_left(times, times[0] + (column_end_ms - self.first_token) / 1000, seen)
            if end > seen:
                columns.append(x)
            seen = end
        return columns


def build_layout(reply: ReplyPerf) -> TimelineLayout:
    """Place the stages of ``reply`` one after the other, and its tokens at their times."""
    tokenize = Segment("tokenize", 0.0, reply.tokenize_ms)
    cached_length = _cached_length(reply)
    cached = Segment("cached", tokenize.end, cached_length)
    prefill = Segment("prefill", cached.end, reply.prefill_ms)
    first_token = prefill.end if reply.ttft_ms is None else reply.ttft_ms + cached_length
    times = reply.token_times
    streamed_ms = (times[-1] - times[0]) * 1000 if times else 0.0
    decode = Segment("decode", first_token, streamed_ms if reply.decode_ms is None else reply.decode_ms)
    segments = (tokenize, cached, prefill, decode) if cached_length > 0 else (tokenize, prefill, decode)
    span = max(decode.end, prefill.end, first_token + streamed_ms)
    return TimelineLayout(segments, span, first_token, times)


def _cached_length(reply: ReplyPerf) -> float:
    if reply.reused_tokens <= 0:
        return 0.0
    real_work = reply.tokenize_ms + reply.prefill_ms + (reply.decode_ms or 0.0)
    if reply.prefill_tok_s is None:
        return CACHED_SHARE_WHEN_NO_RATE * max(real_work, 1.0)
    at_prefill_rate = reply.reused_tokens / reply.prefill_tok_s * 1000
    return min(at_prefill_rate, max(real_work, 1.0))


def to_pixels(layout: TimelineLayout, width: float, span: float) -> list[tuple[Segment, float, float]]:
    """``(segment, x, w)`` for the segments that start before ``span`` ms, ``span`` being ``width`` px."""
    scale = width / span if span > 0 else 0.0
    placed = []
    for segment in layout.segments:
        if segment.start < span:
            placed.append((segment, segment.start * scale, (min(segment.end, span) - segment.start) * scale))
    return placed


class StageTimeline(QWidget):
    """Two bars (the whole reply; zoomed up to its first token) and a legend of durations."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.layout_data: TimelineLayout | None = None
        self.reply: ReplyPerf | None = None
        self.whole_bar = _TimelineBar(self, zoomed=False)
        self.zoom_bar = _TimelineBar(self, zoomed=True)
        self.legend = QLabel(objectName="timeline_legend", wordWrap=True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 4, 0, 0)
        box.setSpacing(4)
        for widget in (self.whole_bar, self.zoom_bar, self.legend):
            box.addWidget(widget)
        self.show_reply(None)

    def show_reply(self, reply: ReplyPerf | None) -> None:
        self.reply = reply
        self.layout_data = build_layout(reply) if reply is not None else None
        self.legend.setText(_legend_html(reply) if reply is not None else "No reply yet.")
        self.whole_bar.update()
        self.zoom_bar.update()

    def cached_caption(self) -> str:
        reused = self.reply.reused_tokens if self.reply is not None else 0
        return f"cached: {format_tokens(reused)} skipped"

    def row_caption(self, zoomed: bool) -> str:
        if not zoomed:
            return "Whole reply, to scale"
        ttft = self.reply.ttft_ms if self.reply is not None else None
        return "Up to the first token" + ("" if ttft is None else f" ({format_ms(ttft)})")


class _TimelineBar(QWidget):
    """One row of the timeline: a caption, the stage bar, and a tick per streamed token."""

    CAPTION_HEIGHT = 16
    BAR_HEIGHT = 22
    TICK_HEIGHT = 8

    def __init__(self, timeline: StageTimeline, zoomed: bool) -> None:
        super().__init__(timeline)
        self._timeline = timeline
        self.zoomed = zoomed
        self.setMinimumHeight(self.CAPTION_HEIGHT + self.BAR_HEIGHT + self.TICK_HEIGHT + 3)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def span(self) -> float:
        layout = self._timeline.layout_data
        if layout is None:
            return 0.0
        return layout.first_token if self.zoomed else layout.span

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().text().color())
        caption = QRectF(0, 0, self.width(), self.CAPTION_HEIGHT)
        painter.drawText(caption, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self._timeline.row_caption(self.zoomed))
        bar = QRectF(0, self.CAPTION_HEIGHT, self.width() - 1, self.BAR_HEIGHT)
        painter.fillRect(bar, self.palette().alternateBase())
        layout, span = self._timeline.layout_data, self.span()
        if layout is not None and span > 0:
            for segment, x, w in to_pixels(layout, bar.width(), span):
                self._paint_segment(painter, segment, QRectF(x, bar.top(), max(w, 1.0), bar.height()))
            self._paint_ticks(painter, layout, bar, span)
        painter.end()

    def _paint_segment(self, painter: QPainter, segment: Segment, rect: QRectF) -> None:
        color = STAGE_COLORS[segment.kind]
        if segment.kind == "cached":
            ghost = QColor(color)
            ghost.setAlpha(50)
            painter.fillRect(rect, ghost)
            painter.fillRect(rect, QBrush(color, Qt.BrushStyle.BDiagPattern))
            painter.setPen(QPen(color, 1, Qt.PenStyle.DashLine))
            painter.drawRect(rect.adjusted(0, 0, -1, -1))
            self._paint_label(painter, rect, self._timeline.cached_caption(), self.palette().text().color())
        else:
            painter.fillRect(rect, color)
            self._paint_label(painter, rect, segment.kind, QColor("white"))

    @staticmethod
    def _paint_label(painter: QPainter, rect: QRectF, text: str, color: QColor) -> None:
        if painter.fontMetrics().horizontalAdvance(text) + 8 > rect.width():
            return
        painter.setPen(color)
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)

    def _paint_ticks(self, painter: QPainter, layout: TimelineLayout, bar: QRectF, span: float) -> None:
        top = bar.bottom() + 2
        tick_color = QColor(STAGE_COLORS["decode"])
        tick_color.setAlpha(170)
        painter.setPen(QPen(tick_color, 1))
        columns = layout.tick_columns(round(bar.width()), span)
        painter.drawLines([QLineF(x + 0.5, top, x + 0.5, top + self.TICK_HEIGHT) for x in columns])


def _nowrap(text: str) -> str:
    return text.replace(" ", "&nbsp;")


def _swatch(kind: str, text: str, mark: str = "■") -> str:
    color = STAGE_COLORS[kind].name()
    mark = "▨" if kind == "cached" else mark
    return f'<span style="color:{color}">{mark}</span>&nbsp;{_nowrap(text)}'


def _legend_html(reply: ReplyPerf) -> str:
    items = [_swatch("tokenize", f"tokenize {format_ms(reply.tokenize_ms)}")]
    if reply.reused_tokens > 0:
        items.append(_swatch("cached", f"cached: {format_tokens(reply.reused_tokens)} skipped"))
    prefill_text = f"prefill {format_ms(reply.prefill_ms)} ({format_tokens(reply.new_tokens)})"
    items.append(_swatch("prefill", prefill_text))
    decode_text = "decode running…" if reply.decode_ms is None else f"decode {format_ms(reply.decode_ms)}"
    items.append(_swatch("decode", decode_text))
    items.append(_swatch("decode", f"{format_tokens(reply.tokens_generated)} streamed", mark="┃"))
    return " &nbsp; ".join(items)
