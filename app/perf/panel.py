"""The performance panel: the reply on screen, the batch, the session, memory, context fill, and plots.

Runs on the GUI thread. ``on_event`` folds an engine event into ``PerfState``
(O(1)) and notes which parts of the panel it touched; a single-shot timer then
refreshes those parts, at most ``MAX_REFRESH_HZ`` times a second (a new stage of a
reply), and ``STREAMING_REFRESH_HZ`` times while only tokens and memory samples
arrive, and only while the panel is visible. Such a refresh is kept cheap: labels whose
text is unchanged are left alone, the figures that change with every token sit
in fixed-size labels (so the panel is not laid out again), and each plot repaints
only when its picture changed. Every figure shown is one the engine sent (or a
sum or quotient of such figures), formatted by ``app.perf.format``.

Replies of several conversations may stream at once: the reply figures, the timeline,
the context bar and the decode line are those of the conversation on screen
(``show_conversation``; ``track_reply`` says which conversation a request answers).
The batch box, shown once the engine sends a ``BatchSampled``, is about all of them:
replies running and waiting, the throughput across them, and the KV pool's blocks.
"""

from __future__ import annotations

import html
from dataclasses import replace

from PySide6.QtCore import QEvent, QTimer, Signal
from PySide6.QtGui import QColor, QHideEvent, QShowEvent
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.perf.chart import ChartLine, LineChart
from app.perf.context_bar import ContextBar
from app.perf.format import (
    UNKNOWN,
    format_blocks,
    format_bytes,
    format_count,
    format_drafts,
    format_finish_reason,
    format_ms,
    format_number,
    format_per_step,
    reading_note,
    format_tok_s,
    format_tokens,
)
from app.perf.remote_box import RemoteFiguresBox
from app.perf.state import DECODE_WINDOW_S, MEMORY_WINDOW_S, PerfState, ReplyPerf
from app.perf.timeline import StageTimeline
from engine.protocol.messages import BatchSampled, Event, MemorySampled, MemoryStats, TokenStreamed

MAX_REFRESH_HZ = 10
STREAMING_REFRESH_HZ = 5  # live figures read fine at this rate, and it halves the panel's CPU time

ALL_PARTS = frozenset({"model", "reply", "session", "memory", "context", "batch"})
PARTS_CHANGED_BY = {
    TokenStreamed: frozenset({"tokens", "context"}),
    MemorySampled: frozenset({"memory"}),
    BatchSampled: frozenset({"batch"}),
}
STREAMING_PARTS = frozenset({"tokens", "context", "memory", "batch"})
POOL_KEYS = ("pool_used", "pool_shared", "pool_cached", "pool_free")
LIVE_VALUE_SAMPLES = {
    "decode_speed": format_tok_s(88_888.0),
    "tokens_generated": format_count(88_888),
    "batch_running": format_count(8_888),
    "batch_waiting": format_count(8_888),
    "batch_throughput": format_tok_s(88_888.0),
    **{key: f"{format_count(88_888)} · {format_bytes(1000 * 1024**2)}" for key in POOL_KEYS},
    **{key: format_bytes(1000 * 1024**2) for key in ("kv_conversation", "kv_total", "device_used", "device_free", "process_rss")},
}

REPLY_ROWS = (
    ("ttft", "Time to first token"),
    ("tokenize", "Tokenize"),
    ("reused", "Prompt reused from cache"),
    ("prefilled", "Prompt newly prefilled"),
    ("prefill_speed", "Prefill speed"),
    ("decode_speed", "Decode speed"),
    ("tokens_generated", "Tokens generated"),
    ("drafts", "Drafted tokens"),
    ("tokens_per_step", "Tokens per step"),
    ("finish_reason", "Stopped because"),
    ("dropped_turns", "History dropped"),
)
BATCH_ROWS = (
    ("batch_running", "Replies running"),
    ("batch_waiting", "Replies waiting"),
    ("batch_throughput", "Throughput, all replies"),
    ("pool_size", "KV pool"),
    ("pool_used", "KV blocks in use"),
    ("pool_shared", "KV blocks shared"),
    ("pool_cached", "KV blocks cached"),
    ("pool_free", "KV blocks free"),
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


class LiveValueLabel(QLabel):
    """A value that changes with every token, in a fixed-size label: new text relays out nothing.

    It is sized for ``sample`` and only grows (once) if a value is wider still.
    """

    def __init__(self, sample: str, object_name: str) -> None:
        super().__init__(UNKNOWN, objectName=object_name)
        self._sample = sample
        self._fit(sample)

    def show_text(self, text: str) -> None:
        if text == self.text():
            return
        if len(text) > self._fitting_length and self.fontMetrics().horizontalAdvance(text) > self.contentsRect().width():
            self._fit(text)
        self.setText(text)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit(self._sample)

    def _fit(self, text: str) -> None:
        """Make room for ``text``; texts no longer than it (digits are of equal width) are not measured."""
        margins = self.contentsMargins()
        width = self.fontMetrics().horizontalAdvance(text) + margins.left() + margins.right() + 2 * self.margin() + 2
        self.setFixedSize(max(width, self.minimumWidth()), self.fontMetrics().height() + margins.top() + margins.bottom())
        self._fitting_length = len(text)


class PerformancePanel(QWidget):
    """Live performance figures of the engine; feed it every event with ``on_event``."""

    refreshed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("performance_panel")
        self.state = PerfState()
        self._stale_parts: set[str] = set()
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self._refresh_if_visible)
        self._values: dict[str, QLabel] = {}
        self._captions: dict[str, QLabel] = {}
        self._build()
        self._values["finish_reason"].setWordWrap(True)
        self._values["pool_size"].setWordWrap(True)
        self.refresh()

    def on_event(self, event: Event) -> None:
        """Take one engine event; the labels catch up on the next timer tick."""
        if self.state.apply(event):
            self._mark_stale(PARTS_CHANGED_BY.get(type(event), ALL_PARTS))

    def show_conversation(self, conversation_id: str) -> None:
        """Show the figures of ``conversation_id``'s replies from now on (the conversation on screen)."""
        self.state.show_conversation(conversation_id)
        self._mark_stale(ALL_PARTS)

    def track_reply(self, request_id: str, conversation_id: str) -> None:
        """``request_id`` answers ``conversation_id``; told before the request's first event."""
        if self.state.track(request_id, conversation_id):
            self._mark_stale(frozenset({"reply", "context"}))

    def _mark_stale(self, parts: frozenset[str]) -> None:
        self._stale_parts |= parts
        if self.isVisible() and (not parts <= STREAMING_PARTS or not self._timer.isActive()):
            self._schedule_refresh()  # else the running timer will do, or showEvent starts it

    def _schedule_refresh(self) -> None:
        """Run the timer, or bring it forward: a new stage shows sooner than a new token."""
        hz = STREAMING_REFRESH_HZ if self._stale_parts <= STREAMING_PARTS else MAX_REFRESH_HZ
        if not self._timer.isActive() or self._timer.remainingTime() > 1000 // hz:
            self._timer.start(1000 // hz)

    def value_text(self, key: str) -> str:
        return self._values[key].text()

    def refresh(self) -> None:
        """Show the whole current state now (a test may call this)."""
        self._stale_parts = set(ALL_PARTS)
        self._refresh_stale_parts()

    def _refresh_stale_parts(self) -> None:
        stale, self._stale_parts = self._stale_parts, set()
        if "model" in stale:
            self._show_model()
        if "reply" in stale:
            self._show_reply(self.state.reply)
        elif "tokens" in stale:
            self._show_tokens(self.state.reply)
        if "session" in stale:
            self._show_session()
        if "batch" in stale:
            self._show_batch(self.state.batch)
        if "memory" in stale:
            self._show_memory(self.state.memory)
        for chart in (self.decode_chart, self.memory_chart):
            chart.show_until(self.state.now, force=stale == ALL_PARTS)
        if "context" in stale:
            self._show_context()  # last: a new fill paints at once, with what is pending
        self.refreshed.emit()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._stale_parts:
            self._schedule_refresh()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self._timer.stop()

    def _refresh_if_visible(self) -> None:
        if self._stale_parts and self.isVisible():
            self._refresh_stale_parts()

    def _build(self) -> None:
        column = QVBoxLayout(self)
        self.model_label = QLabel(objectName="model_label", wordWrap=True)
        column.addWidget(self.model_label)
        self.timeline = StageTimeline()
        reply_box = self._form_box("Reply", REPLY_ROWS)
        reply_box.layout().addRow(self.timeline)
        column.addWidget(reply_box)
        self.remote_box = RemoteFiguresBox()
        column.addWidget(self.remote_box)
        self.context_bar = ContextBar()
        column.addWidget(self._boxed("Context", self.context_bar))
        self.batch_box = self._form_box("Batch (all conversations)", BATCH_ROWS)
        self.batch_box.hide()  # until the engine says it batches
        column.addWidget(self.batch_box)
        column.addWidget(self._form_box("Session (since the model loaded)", SESSION_ROWS))
        column.addWidget(self._form_box("Memory", MEMORY_ROWS))
        self._build_charts(column)
        column.addStretch(1)

    def _build_charts(self, column: QVBoxLayout) -> None:
        decode_line = ChartLine("this reply", QColor("#3d85c6"), self.state.decode_speed)
        batch_line = ChartLine("all replies", QColor("#e69138"), self.state.batch_throughput)
        self.decode_chart = LineChart("Decode speed (tok/s)", [decode_line, batch_line], format_number, DECODE_WINDOW_S)
        used_line = ChartLine("memory used", QColor("#6aa84f"), self.state.device_used)
        rss_line = ChartLine("process RSS", QColor("#c27ba0"), self.state.process_rss)
        self.memory_chart = LineChart("Memory", [used_line, rss_line], format_bytes, MEMORY_WINDOW_S, value_base=1024)
        column.addWidget(self.decode_chart)
        column.addWidget(self.memory_chart)

    def _form_box(self, title: str, rows: tuple[tuple[str, str], ...]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for key, caption in rows:
            if key in LIVE_VALUE_SAMPLES:
                value = LiveValueLabel(LIVE_VALUE_SAMPLES[key], value_label_name(key))
            else:
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
        if isinstance(label, LiveValueLabel):
            label.show_text(text)
        elif label.text() != text:
            label.setText(text)

    def _show_model(self) -> None:
        model = self.state.model
        if model is None:
            self.model_label.setText("No model loaded.")
            return
        context = format_tokens(model.context_length)
        where = f"remote server {html.escape(model.server)} (figures measured here)" if model.server else model.device
        choices = [f"{model.kv_cache} KV cache"] if model.kv_cache else []
        choices += [f"drafting with {html.escape(model.draft_model)}"] if model.draft_model else []
        self.model_label.setText(" · ".join([f"<b>{html.escape(model.name)}</b>", where, model.precision,
                                             f"{context} context", *choices]))

    def _show_reply(self, reply: ReplyPerf | None) -> None:
        self._show_tokens(reply)
        self.remote_box.show_figures(self.state.model.server if self.state.model else "", reply.remote if reply else None)
        if reply is None or reply.waiting:
            for key, _ in REPLY_ROWS:
                self._set(key, UNKNOWN)
            if reply is not None:
                self._set("finish_reason", reading_note(*reply.reading) if reply.reading else "waiting for its turn…")
            return
        self._set("ttft", format_ms(reply.ttft_ms))
        self._set("tokenize", format_ms(reply.tokenize_ms))
        self._set("reused", format_tokens(reply.reused_tokens))
        self._set("prefilled", format_tokens(reply.new_tokens))
        self._set("prefill_speed", format_tok_s(reply.prefill_tok_s))
        reason = format_finish_reason(reply.finish_reason)
        self._set("finish_reason", reason if reply.failure is None else f"{reason}: {reply.failure}")
        self._set("dropped_turns", dropped_turns_text(reply.dropped_turns))
        finished_here = reply.done and reply.remote is None and reply.decode_steps > 0
        self._set("drafts", format_drafts(reply.drafted_tokens, reply.accepted_tokens) if finished_here else UNKNOWN)
        self._set("tokens_per_step", format_per_step(reply.tokens_generated, reply.decode_steps)
                  if finished_here else UNKNOWN)

    def _show_tokens(self, reply: ReplyPerf | None) -> None:
        """What a streamed token changes: the live figures and the timeline."""
        self.timeline.show_reply(reply)
        if reply is not None:
            self._set("ttft", format_ms(reply.ttft_ms))
            self._set("decode_speed", format_tok_s(self.state.reply_decode_tok_s))
            self._set("tokens_generated", format_count(reply.tokens_generated))
            self._show_chat_kv()

    def _show_chat_kv(self) -> None:
        kv_conversation = self.state.reply_kv_bytes
        self._set("kv_conversation", UNKNOWN if kv_conversation is None else format_bytes(kv_conversation))

    def _show_session(self) -> None:
        session = self.state.session
        self._set("session_throughput", format_tok_s(session.throughput_tok_s))
        self._set("session_replies", format_count(session.replies))

    def _show_batch(self, batch: BatchSampled | None) -> None:
        """The batch and its KV pool; the box stays hidden while the engine sends no such figures."""
        self.batch_box.setVisible(batch is not None)
        if batch is None:
            return
        pool = batch.pool
        self._set("batch_running", format_count(batch.running))
        self._set("batch_waiting", format_count(batch.waiting))
        self._set("batch_throughput", format_tok_s(self.state.throughput_tok_s))
        size = f"{format_count(pool.blocks_total)} blocks of {format_tokens(pool.block_size)}"
        self._set("pool_size", f"{size} · {format_bytes(pool.blocks_total * pool.bytes_per_block)}")
        free = pool.blocks_total - pool.blocks_used - pool.blocks_cached
        counts = (pool.blocks_used, pool.blocks_shared, pool.blocks_cached, free)
        for key, count in zip(POOL_KEYS, counts):
            self._set(key, format_blocks(count, pool.bytes_per_block))
        self._set("kv_total", format_bytes(self.state.kv_total_bytes))

    def _show_memory(self, memory: MemoryStats | None) -> None:
        if memory is None:
            for key, _ in MEMORY_ROWS:
                self._set(key, UNKNOWN)
            return
        for part in ("used", "free", "total"):
            self._captions[f"device_{part}"].setText(f"{device_kind(memory)} memory {part}")
        self._name_used_line(f"{device_kind(memory).lower()} memory used")
        self._set("weights", format_bytes(memory.weight_bytes))
        self._show_chat_kv()
        self._set("kv_total", format_bytes(self.state.kv_total_bytes))
        self._set("device_used", format_bytes(memory.device_used_bytes))
        self._set("device_free", format_bytes(memory.device_free_bytes))
        self._set("device_total", format_bytes(memory.device_total_bytes))
        self._set("process_rss", format_bytes(memory.process_rss_bytes))

    def _name_used_line(self, name: str) -> None:
        """The memory chart's first line is what the engine measured: GPU memory, or on a CPU the whole system's."""
        used_line = self.memory_chart.lines[0]
        if used_line.name != name:
            self.memory_chart.lines = [replace(used_line, name=name), *self.memory_chart.lines[1:]]
            self.memory_chart.update()

    def _show_context(self) -> None:
        reply = self.state.reply
        in_use = reply.context_in_use if reply is not None else None
        self.context_bar.show_fill(in_use, self.state.context_length)
