"""The stage timeline of one reply, drawn to scale: tokenize | prefill | decode loop.

``build_layout`` (pure, no Qt) turns a ``ReplyPerf`` into segments on one axis
of milliseconds; ``StageTimeline`` paints it on the GUI thread. The bars are time
to scale, so the part of the prompt found in the KV cache, which took no time,
takes no width: the legend names it ("cached: N tokens skipped"). While tokens
stream only the whole-reply bar changes, so only it is repainted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QStaticText
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.perf.backdrop import Backdrop
from app.perf.format import format_ms, format_tokens
from app.perf.state import ReplyPerf

STAGE_COLORS = {
    "tokenize": QColor("#8e7cc3"),
    "cached": QColor("#e69138"),
    "prefill": QColor("#e69138"),
    "decode": QColor("#3d85c6"),
}


def _with_alpha(color: QColor, alpha: int) -> QColor:
    translucent = QColor(color)
    translucent.setAlpha(alpha)
    return translucent


_LABEL_ON_STAGE = QColor("white")
_TICK_COLOR = _with_alpha(STAGE_COLORS["decode"], 170)
_STATIC_TEXTS_KEPT = 32


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
        """The pixel columns (of ``width`` showing ``span`` ms) that hold at least one tick."""
        return [x for first, count in self.tick_runs(width, span) for x in range(first, first + count)]

    def tick_runs(self, width: int, span: float) -> list[tuple[int, int]]:
        """``(first, count)`` for each stretch of adjacent pixel columns holding ticks.

        Column ``x`` holds the ticks before its right edge, ``x + 0.5`` pixels
        in (the last column ends at ``span``). One binary search per column
        that holds a tick (empty columns are jumped over), so painting costs
        the same for a hundred tokens or ten thousand, and a dense stretch is
        one rectangle.
        """
        times = self.token_times
        if not times or span <= 0 or width <= 0:
            return []
        ms_per_px, start, first_token = span / width, times[0], self.first_token
        edges = [start + ((x + 0.5) * ms_per_px - first_token) / 1000 for x in range(width - 1)]
        edges.append(start + (span * (1 + 1e-9) - first_token) / 1000)
        runs: list[tuple[int, int]] = []
        index, column = 0, 0
        while index < len(times):
            column = bisect.bisect_right(edges, times[index], column)  # the first edge past the tick
            if column == width:
                break
            if runs and runs[-1][0] + runs[-1][1] == column:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((column, 1))
            index = bisect.bisect_left(times, edges[column], index + 1)
        return runs


def build_layout(reply: ReplyPerf) -> TimelineLayout:
    """Place the stages of ``reply`` one after the other, and its tokens at their times."""
    tokenize = Segment("tokenize", 0.0, reply.tokenize_ms)
    prefill = Segment("prefill", tokenize.end, reply.prefill_ms)
    first_token = prefill.end if reply.ttft_ms is None else reply.ttft_ms
    times = reply.token_times
    streamed_ms = (times[-1] - times[0]) * 1000 if times else 0.0
    decode = Segment("decode", first_token, streamed_ms if reply.decode_ms is None else reply.decode_ms)
    segments = (tokenize, prefill, decode)
    span = max(decode.end, prefill.end, first_token + streamed_ms)
    return TimelineLayout(segments, span, first_token, times)


def to_pixels(layout: TimelineLayout, width: float, span: float) -> list[tuple[Segment, float, float]]:
    """``(segment, x, w)`` for the segments that start before ``span`` ms, ``span`` being ``width`` px."""
    scale = width / span if span > 0 else 0.0
    placed = []
    for segment in layout.segments:
        if segment.start < span:
            placed.append((segment, segment.start * scale, (min(segment.end, span) - segment.start) * scale))
    return placed


def stage_key(reply: ReplyPerf | None) -> tuple | None:
    """What the legend and the zoomed row show: all of a reply but the tokens streamed so far."""
    if reply is None:
        return None
    figures = (reply.tokenize_ms, reply.prompt_tokens, reply.reused_tokens, reply.prefill_ms, reply.ttft_ms, reply.decode_ms)
    final_count = reply.tokens_generated if reply.done else None
    return (reply.request_id, *figures, reply.finish_reason, final_count, bool(reply.token_times))


class StageTimeline(QWidget):
    """Two bars (the whole reply; zoomed up to its first token) and a legend of durations."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.layout_data: TimelineLayout | None = None
        self.reply: ReplyPerf | None = None
        self._stage_key: tuple | None = ()
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
        """Redraw for ``reply``: the legend and zoomed row only when a stage changed, not for new tokens."""
        self.reply = reply
        self.layout_data = build_layout(reply) if reply is not None else None
        self.whole_bar.update()
        key = stage_key(reply)
        if key != self._stage_key:
            self._stage_key = key
            self.legend.setText(_legend_html(reply) if reply is not None else "No reply yet.")
            self.zoom_bar.update()

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
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)  # the backdrop covers every pixel
        self._backdrop = Backdrop(self)
        self._static_texts: dict[str, QStaticText] = {}

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._static_texts.clear()
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            self._backdrop.invalidate()

    def static_text(self, text: str) -> QStaticText:
        """``text`` laid out once: the few captions and labels are repainted several times a second."""
        if text not in self._static_texts:
            if len(self._static_texts) >= _STATIC_TEXTS_KEPT:
                self._static_texts.clear()  # old replies' captions
            static = QStaticText(text)
            static.prepare(font=self.font())
            self._static_texts[text] = static
        return self._static_texts[text]

    def span(self) -> float:
        layout = self._timeline.layout_data
        if layout is None:
            return 0.0
        return layout.first_token if self.zoomed else layout.span

    def paintEvent(self, event: QPaintEvent) -> None:
        palette = self.palette()
        painter = QPainter(self)
        painter.drawPixmap(0, 0, self._backdrop.pixmap())
        painter.setPen(palette.text().color())
        caption = self.static_text(self._timeline.row_caption(self.zoomed))
        painter.drawStaticText(QPointF(0, (self.CAPTION_HEIGHT - caption.size().height()) / 2), caption)
        bar = QRectF(0, self.CAPTION_HEIGHT, self.width() - 1, self.BAR_HEIGHT)
        painter.fillRect(bar, palette.alternateBase())
        layout, span = self._timeline.layout_data, self.span()
        if layout is not None and span > 0:
            for segment, x, w in to_pixels(layout, bar.width(), span):
                self._paint_segment(painter, segment, QRectF(x, bar.top(), max(w, 1.0), bar.height()))
            self._paint_ticks(painter, layout, bar, span)
        painter.end()

    def _paint_segment(self, painter: QPainter, segment: Segment, rect: QRectF) -> None:
        painter.fillRect(rect, STAGE_COLORS[segment.kind])
        self._paint_label(painter, rect, segment.kind, _LABEL_ON_STAGE)

    def _paint_label(self, painter: QPainter, rect: QRectF, text: str, color: QColor) -> None:
        label = self.static_text(text)
        size = label.size()
        if size.width() + 8 > rect.width():
            return
        painter.setPen(color)
        painter.drawStaticText(QPointF(rect.center().x() - size.width() / 2, rect.center().y() - size.height() / 2), label)

    def _paint_ticks(self, painter: QPainter, layout: TimelineLayout, bar: QRectF, span: float) -> None:
        top = bar.bottom() + 2
        for x, width in layout.tick_runs(round(bar.width()), span):
            painter.fillRect(QRectF(x, top, width, self.TICK_HEIGHT + 1), _TICK_COLOR)


def _nowrap(text: str) -> str:
    return text.replace(" ", "&nbsp;")


def _swatch(kind: str, text: str, mark: str = "■") -> str:
    color = STAGE_COLORS[kind].name()
    mark = "▨" if kind == "cached" else mark
    return f'<span style="color:{color}">{mark}</span>&nbsp;{_nowrap(text)}'


def _legend_html(reply: ReplyPerf) -> str:
    """Stage durations; it changes with stages, not tokens (relaying out rich text is slow).

    While the reply streams, its live token count is the panel's "Tokens generated" row.
    """
    items = [_swatch("tokenize", f"tokenize {format_ms(reply.tokenize_ms)}")]
    if reply.reused_tokens > 0:
        items.append(_swatch("cached", f"cached: {format_tokens(reply.reused_tokens)} skipped"))
    prefill_text = f"prefill {format_ms(reply.prefill_ms)} ({format_tokens(reply.new_tokens)})"
    items.append(_swatch("prefill", prefill_text))
    decode_text = "decode running…" if reply.decode_ms is None else f"decode {format_ms(reply.decode_ms)}"
    items.append(_swatch("decode", decode_text))
    ticks_text = f"{format_tokens(reply.tokens_generated)} streamed" if reply.done else "a token streamed"
    items.append(_swatch("decode", ticks_text, mark="┃"))
    return " &nbsp; ".join(items)
