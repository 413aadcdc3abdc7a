"""The performance panel: the current reply, the session, memory, context fill, and plots.

Runs on the GUI thread. ``on_event`` folds an engine event into ``PerfState``
(O(1)) and marks the panel dirty; a single-shot timer then refreshes labels and
repaints the plots, at most ``MAX_REFRESH_HZ`` times a second, and only while
the panel is visible. Every figure shown is one the engine sent (or a sum or
quotient of such figures), formatted by ``app.perf.format``.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QColor, QHideEvent, QShowEvent
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.perf.chart import ChartLine, LineChart
from app.perf.context_bar import ContextBar
from app.perf.format import (
    UNKNOWN,
    format_bytes,
    format_count,
    format_finish_reason,
    format_ms,
    format_number,
    format_tok_s,
    format_tokens,
)
from app.perf.state import DECODE_WINDOW_S, MEMORY_WINDOW_S, PerfState, ReplyPerf
from app.perf.timeline import StageTimeline
from engine.messages import Event, MemoryStats

MAX_REFRESH_HZ = 10

REPLY_ROWS = (
    ("ttft", "Time to first token"),
    ("tokenize", "Tokenize"),
    ("reused", "Prompt reused from cache"),
    ("prefilled", "Prompt newly prefilled"),
    ("prefill_speed", "Prefill speed"),
    ("decode_speed", "Decode speed"),
    ("tokens_generated", "Tokens generated"),
    ("finish_reason", "Stopped because"),
    ("dropped_turns", "History dropped"),
)
SESSION_ROWS = (("session_throughput", "Throughput"), ("session_replies", "Replies"))
MEMORY_ROWS = (
    ("weights", "Model weights"),
    ("kv_conversation", "KV cache, this chat"),
    ("kv_total", "KV cache, all kept chats"),
    ("device_used", "Device memory used"),
    ("device_free", "Device memory free"),
    ("device_total", "Device memory total"),
    ("process_rss", "Process RSS"),
)


def value_label_name(key: str) -> str:
    """The objectName of the QLabel that shows figure ``key`` (tests find labels by it)."""
    return f"{key}_value"


def device_kind(memory: MemoryStats) -> str:
    """"GPU" when the engine measures a CUDA device, else "System" (it reports RAM)."""
    return "GPU" if memory.device == "cuda" else "System"


def dropped_turns_text(dropped_turns: tuple[int, ...]) -> str:
    count = len(dropped_turns)
    if count == 0:
        return "none"
    return f"{count} oldest turn{'s' if count != 1 else ''} dropped to fit"


class PerformancePanel(QWidget):
    """Live performance figures of the engine; feed it every event with ``on_event``."""

    refreshed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("performance_panel")
        self.state = PerfState()
        self._dirty = False
        self._timer = QTimer(self, singleShot=True, interval=1000 // MAX_REFRESH_HZ)
        self._timer.timeout.connect(self._refresh_if_visible)
        self._values: dict[str, QLabel] = {}
        self._captions: dict[str, QLabel] = {}
        self._build()
        self._values["finish_reason"].setWordWrap(True)
        self.refresh()

    def on_event(self, event: Event) -> None:
        """Take one engine event; the labels catch up on the next timer tick."""
        if not self.state.apply(event) or self._dirty:
            return  # already dirty: the timer runs, or showEvent will start it
        self._dirty = True
        if self.isVisible():
            self._timer.start()

    def value_text(self, key: str) -> str:
        return self._values[key].text()

    def refresh(self) -> None:
        """Show the current state now (the timer calls this; so may a test)."""
        self._dirty = False
        self._show_model()
        self._show_reply(self.state.reply)
        self._show_session()
        self._show_memory(self.state.memory)
        self._show_context()
        for chart in (self.decode_chart, self.memory_chart):
            chart.set_now(self.state.now)
            chart.update()
        self.refreshed.emit()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._dirty:
            self._timer.start()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self._timer.stop()

    def _refresh_if_visible(self) -> None:
        if self._dirty and self.isVisible():
            self.refresh()

    def _build(self) -> None:
        column = QVBoxLayout(self)
        self.model_label = QLabel(objectName="model_label", wordWrap=True)
        column.addWidget(self.model_label)
        self.timeline = StageTimeline()
        reply_box = self._form_box("Reply", REPLY_ROWS)
        reply_box.layout().addRow(self.timeline)
        column.addWidget(reply_box)
        self.context_bar = ContextBar()
        column.addWidget(self._boxed("Context", self.context_bar))
        column.addWidget(self._form_box("Session (since the model loaded)", SESSION_ROWS))
        column.addWidget(self._form_box("Memory", MEMORY_ROWS))
        self._build_charts(column)
        column.addStretch(1)

    def _build_charts(self, column: QVBoxLayout) -> None:
        decode_line = ChartLine("decode", QColor("#3d85c6"), self.state.decode_speed)
        self.decode_chart = LineChart("Decode speed (tok/s)", [decode_line], format_number, DECODE_WINDOW_S)
        used_line = ChartLine("device used", QColor("#6aa84f"), self.state.device_used)
        rss_line = ChartLine("process RSS", QColor("#c27ba0"), self.state.process_rss)
        self.memory_chart = LineChart("Memory", [used_line, rss_line], format_bytes, MEMORY_WINDOW_S, value_base=1024)
        column.addWidget(self.decode_chart)
        column.addWidget(self.memory_chart)

    def _form_box(self, title: str, rows: tuple[tuple[str, str], ...]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for key, caption in rows:
            value = QLabel(UNKNOWN, objectName=value_label_name(key))
            self._values[key] = value
            self._captions[key] = QLabel(caption, objectName=f"{key}_caption")
            form.addRow(self._captions[key], value)
        return box

    @staticmethod
    def _boxed(title: str, widget: QWidget) -> QGroupBox:
        box = QGroupBox(title)
        QVBoxLayout(box).addWidget(widget)
        return box

    def _set(self, key: str, text: str) -> None:
        label = self._values[key]
        if label.text() != text:
            label.setText(text)

    def _show_model(self) -> None:
        model = self.state.model
        if model is None:
            self.model_label.setText("No model loaded.")
            return
        context = format_tokens(model.context_length)
        self.model_label.setText(f"<b>{html.escape(model.name)}</b> · {model.device} · {model.precision} · {context} context")

    def _show_reply(self, reply: ReplyPerf | None) -> None:
        self.timeline.show_reply(reply)
        if reply is None:
            for key, _ in REPLY_ROWS:
                self._set(key, UNKNOWN)
            return
        self._set("ttft", format_ms(reply.ttft_ms))
        self._set("tokenize", format_ms(reply.tokenize_ms))
        self._set("reused", format_tokens(reply.reused_tokens))
        self._set("prefilled", format_tokens(reply.new_tokens))
        self._set("prefill_speed", format_tok_s(reply.prefill_tok_s))
        self._set("decode_speed", format_tok_s(reply.decode_tok_s))
        self._set("tokens_generated", format_count(reply.tokens_generated))
        reason = format_finish_reason(reply.finish_reason)
        self._set("finish_reason", reason if reply.failure is None else f"{reason}: {reply.failure}")
        self._set("dropped_turns", dropped_turns_text(reply.dropped_turns))

    def _show_session(self) -> None:
        session = self.state.session
        self._set("session_throughput", format_tok_s(session.throughput_tok_s))
        self._set("session_replies", format_count(session.replies))

    def _show_memory(self, memory: MemoryStats | None) -> None:
        if memory is None:
            for key, _ in MEMORY_ROWS:
                self._set(key, UNKNOWN)
            return
        for part in ("used", "free", "total"):
            self._captions[f"device_{part}"].setText(f"{device_kind(memory)} memory {part}")
        self._set("weights", format_bytes(memory.weight_bytes))
        self._set("kv_conversation", format_bytes(memory.kv_bytes_conversation))
        self._set("kv_total", format_bytes(memory.kv_bytes_total))
        self._set("device_used", format_bytes(memory.device_used_bytes))
        self._set("device_free", format_bytes(memory.device_free_bytes))
        self._set("device_total", format_bytes(memory.device_total_bytes))
        self._set("process_rss", format_bytes(memory.process_rss_bytes))

    def _show_context(self) -> None:
        reply = self.state.reply
        in_use = reply.context_in_use if reply is not None else None
        self.context_bar.show_fill(in_use, self.state.context_length)
