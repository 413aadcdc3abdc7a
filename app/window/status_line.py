"""The status bar: what the engine is doing, and how fast the last reply was (GUI thread).

The left side follows the engine (downloading N%, loading, ready with the model
and device, errors) and the conversation on screen (generating); the right side
keeps the last reply's speed and time to first token in that conversation, and for
a remote model what its server reported. A load in the background is shown beside
the model still answering; a failed load keeps the previous model's name: the
engine keeps that model. ``show_notice`` covers the left side for a few seconds:
refused sends and errors that end a reply, so the next state does not hide them.
A line too long for the bar is cut there with "…", so each is also the tooltip
while it shows, and a loaded model's notices (the formats chosen and why) stay in
the ready text's tooltip.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QStatusBar, QWidget

from app.controller import EngineController
from app.window.elided_label import ElidedLabel, plain_tooltip
from engine.protocol.messages import (
    EngineError,
    FetchProgress,
    LoadFailed,
    LoadProgress,
    ModelLoaded,
    RemoteFigures,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    StatusChanged,
)

NOTICE_MS = 8000
NOTICE_MARGIN = 6
_MB = 1024 * 1024
_STATE_WORDS = {
    "fetching": "Downloading the model",
    "loading": "Loading the model",
}


def describe_fetch(progress: FetchProgress) -> str:
    done_mb = progress.done_bytes / _MB
    if progress.total_bytes <= 0:
        return f"Downloading the model: {done_mb:.0f} MB"
    percent = 100 * progress.done_bytes / progress.total_bytes
    return f"Downloading the model: {percent:.0f}% ({done_mb:.0f} of {progress.total_bytes / _MB:.0f} MB)"


def describe_model(loaded: ModelLoaded) -> str:
    """The model, where it runs and its formats, with the choices a user made beyond the defaults: an int8 KV cache
    and a draft model."""
    choices = [loaded.precision]
    if loaded.kv_cache == "int8":
        choices.append("int8 KV cache")
    if loaded.draft_model:
        choices.append(f"drafting with {loaded.draft_model}")
    return f"{loaded.name} on {loaded.device} ({'; '.join(choices)})"


def describe_stats(stats: RequestStats) -> str:
    text = (
        f"Last reply: {stats.tokens_generated} tokens, {stats.decode_tok_s:.1f} tokens/s, "
        f"first token after {stats.ttft_ms:.0f} ms"
    )
    return f"{text} {describe_remote(stats.remote)}" if stats.remote else text


def describe_remote(figures: RemoteFigures) -> str:
    """The server's own figures, after what Hearth measured over the network."""
    said = [f"{figures.decode_tok_s:.1f} tokens/s"] if figures.decode_tok_s is not None else []
    cached = figures.cached_tokens if figures.cached_tokens is not None else figures.cache_n
    if cached is not None and figures.prompt_tokens is not None:
        said.append(f"{cached} of {figures.prompt_tokens} prompt tokens cached")
    return f"(measured here; the server says {', '.join(said)})" if said else "(measured here, over the network)"


class StatusLine(QStatusBar):
    """Listens to the controller and says, in words, what the engine is doing for the conversation on screen.

    Replies are followed by conversation (``track_reply``, ``show_conversation``): the
    line says "Generating" while the conversation on screen is being answered, and
    shows that conversation's last reply figures, not another's. Every text is plain
    text, cut with "…" where the bar ends (whole in the tooltip): the bar never asks
    the window for more width.
    """

    def __init__(self, controller: EngineController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Status")
        self.state_label = ElidedLabel("Starting the engine…", self)
        self.state_label.setAccessibleName("Engine status")
        self.stats_label = ElidedLabel("", self)
        self.stats_label.setAccessibleName("Last reply speed")
        # right-aligned: the figures stay at the right while a notice hides the model's line and their label
        # takes the bar's width
        self.stats_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.addWidget(self.state_label, 3)
        self.addPermanentWidget(self.stats_label, 2)
        self._model_text = ""
        self._model_details = ""
        self._activity = ""
        """Downloading or loading progress, or an engine error; "" when none."""
        self._loading = False
        self._notice_details = ""
        self._on_screen = ""
        self._conversation_of: dict[str, str] = {}
        """Request id of each reply in flight → the id of the conversation it answers."""
        self._stats_of: dict[str, str] = {}
        """Conversation id → its last reply's figures, in words."""
        self.messageChanged.connect(self._on_message_changed)
        self._connect(controller)

    def show_notice(self, text: str, details: str = "") -> None:
        """Cover the left side with ``text`` for a while; ``details`` are read in the tooltip."""
        self._notice_details = details
        self.showMessage(text, NOTICE_MS)

    def track_reply(self, request_id: str, conversation_id: str) -> None:
        self._conversation_of[request_id] = conversation_id
        self._refresh()

    def show_conversation(self, conversation_id: str) -> None:
        self._on_screen = conversation_id
        self.stats_label.set_text(self._stats_of.get(conversation_id, ""))
        self._refresh()

    def notice_area(self) -> QRect:
        """Where a notice is drawn: from the left edge to the figures on the right."""
        figures = self.stats_label
        right = figures.x() + figures.text_left() if figures.isVisible() and figures.text() else self.width()
        return QRect(NOTICE_MARGIN, 0, max(0, right - 2 * NOTICE_MARGIN), self.height())

    def paintEvent(self, event: QPaintEvent) -> None:
        """A notice is drawn cut with "…" before the figures on the right, never under them."""
        message = self.currentMessage()
        if not message:
            super().paintEvent(event)
            return
        area = self.notice_area()
        shown = self.fontMetrics().elidedText(message, Qt.TextElideMode.ElideRight, area.width())
        painter = QPainter(self)
        painter.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        painter.drawText(area, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, shown)

    def _on_message_changed(self, message: str) -> None:
        self.setToolTip(plain_tooltip("\n\n".join(part for part in (message, self._notice_details) if part)) if message else "")

    def _connect(self, controller: EngineController) -> None:
        controller.status_changed.connect(self._on_status)
        controller.fetch_progress.connect(lambda event: self._show_activity(describe_fetch(event)))
        controller.load_progress.connect(self._on_load_progress)
        controller.model_loaded.connect(self._on_model_loaded)
        controller.load_failed.connect(self._on_load_failed)
        controller.reply_finished.connect(self._on_reply_finished)
        controller.reply_failed.connect(self._on_reply_failed)
        controller.engine_error.connect(self._on_engine_error)

    def _ready_text(self) -> str:
        return f"Ready: {self._model_text}" if self._model_text else "No model loaded"

    def _refresh(self) -> None:
        """The left side: the conversation on screen being answered, else the model, and any load going on."""
        if self._on_screen in self._conversation_of.values():
            main = f"Generating a reply with {self._model_text}" if self._model_text else "Generating…"
        else:
            main = self._ready_text()
        if self._activity:
            main = f"{main} · {self._activity}" if self._model_text else self._activity
        self.state_label.set_text(main, self._model_details)

    def _show_activity(self, text: str) -> None:
        self._activity = text
        self._refresh()

    def _on_status(self, event: StatusChanged) -> None:
        if event.state in ("fetching", "loading"):
            self._loading = True
            words = _STATE_WORDS[event.state]
            self._show_activity(f"{words}: {event.detail}" if event.detail else f"{words}…")
        elif event.state == "error":
            self._show_activity(f"Error: {event.detail}" if event.detail else "Error")
        elif not self._loading:
            self._show_activity("")

    def _on_load_progress(self, event: LoadProgress) -> None:
        self._show_activity(f"Loading the model: {event.done} of {event.total} {event.unit}")

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self._loading = False
        self._model_text = describe_model(event)
        self._model_details = "\n".join((f"Loaded in {event.load_s:.1f} s.", *event.notices))
        self._show_activity("")

    def _on_load_failed(self, event: LoadFailed) -> None:
        self._loading = False
        self._show_activity("")
        self.show_notice(f"Could not load the model: {event.message}")

    def _end_reply(self, request_id: str) -> str | None:
        """Forget ``request_id``; the id of the conversation it answered, if it was followed."""
        conversation_id = self._conversation_of.pop(request_id, None)
        self._refresh()
        return conversation_id

    def _on_reply_finished(self, event: ReplyFinished) -> None:
        conversation_id = self._end_reply(event.request_id)
        if conversation_id is None:
            return
        self._stats_of[conversation_id] = describe_stats(event.stats)
        if conversation_id == self._on_screen:
            self.stats_label.set_text(self._stats_of[conversation_id])

    def _on_reply_failed(self, event: ReplyFailed) -> None:
        self._end_reply(event.request_id)
        self.show_notice(f"The reply failed: {event.message}")

    def _on_engine_error(self, event: EngineError) -> None:
        self._conversation_of.clear()  # the replies in flight end with it
        self._refresh()
        self.show_notice(f"Engine error: {event.message}")
