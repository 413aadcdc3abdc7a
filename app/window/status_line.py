"""The status bar: what the engine is doing, and how fast the last reply was (GUI thread).

The left side follows the engine (downloading N%, loading, ready with the model
and device, generating, errors); the right side keeps the last reply's speed and
time to first token, and for a remote model what its server reported. A failed load keeps the previous model's name: the engine
keeps that model. ``show_notice`` covers the left side for a few seconds:
refused sends and errors that end a reply, so the next state does not hide them.
A line too long for the bar is cut there, so each is also the bar's tooltip while
it shows, and a loaded model's notices (the formats chosen and why) stay in the
ready text's tooltip.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from app.controller import EngineController
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
_MB = 1024 * 1024
_STATE_WORDS = {
    "fetching": "Downloading the model",
    "loading": "Loading the model",
    "generating": "Generating",
    "error": "Error",
}


def describe_fetch(progress: FetchProgress) -> str:
    done_mb = progress.done_bytes / _MB
    if progress.total_bytes <= 0:
        return f"Downloading the model: {done_mb:.0f} MB"
    percent = 100 * progress.done_bytes / progress.total_bytes
    return f"Downloading the model: {percent:.0f}% ({done_mb:.0f} of {progress.total_bytes / _MB:.0f} MB)"


def describe_model(loaded: ModelLoaded) -> str:
    return f"{loaded.name} on {loaded.device} ({loaded.precision})"


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
    """Listens to the controller and says, in words, what the engine is doing."""

    def __init__(self, controller: EngineController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Status")
        self.state_label = QLabel("Starting the engine…", self)
        self.state_label.setAccessibleName("Engine status")
        self.stats_label = QLabel("", self)
        self.stats_label.setAccessibleName("Last reply speed")
        self.addWidget(self.state_label, 1)
        self.addPermanentWidget(self.stats_label)
        self._model_text = ""
        self.messageChanged.connect(self.setToolTip)  # a notice cut at the bar's edge is read whole on hovering
        self._connect(controller)

    def show_notice(self, text: str) -> None:
        self.showMessage(text, NOTICE_MS)

    def show_state(self, text: str) -> None:
        self.state_label.setText(text)

    def _connect(self, controller: EngineController) -> None:
        controller.status_changed.connect(self._on_status)
        controller.fetch_progress.connect(lambda event: self.show_state(describe_fetch(event)))
        controller.load_progress.connect(self._on_load_progress)
        controller.model_loaded.connect(self._on_model_loaded)
        controller.load_failed.connect(self._on_load_failed)
        controller.reply_finished.connect(self._on_reply_finished)
        controller.reply_failed.connect(self._on_reply_failed)
        controller.engine_error.connect(self._on_engine_error)

    def _ready_text(self) -> str:
        return f"Ready: {self._model_text}" if self._model_text else "No model loaded"

    def _on_status(self, event: StatusChanged) -> None:
        if event.state in ("idle", "ready"):
            self.show_state(self._ready_text())
            return
        words = _STATE_WORDS[event.state]
        self.show_state(f"{words}: {event.detail}" if event.detail else f"{words}…")

    def _on_load_progress(self, event: LoadProgress) -> None:
        self.show_state(f"Loading the model: {event.done} of {event.total} {event.unit}")

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self._model_text = describe_model(event)
        self.show_state(f"{self._ready_text()}, loaded in {event.load_s:.1f} s")
        self.state_label.setToolTip("\n".join((self._model_text, *event.notices)))

    def _on_load_failed(self, event: LoadFailed) -> None:
        self.show_state(f"Could not load the model: {event.message}")
        self.show_notice(f"Could not load the model: {event.message}")

    def _on_reply_finished(self, event: ReplyFinished) -> None:
        self.stats_label.setText(describe_stats(event.stats))
        self.show_state(self._ready_text())

    def _on_reply_failed(self, event: ReplyFailed) -> None:
        self.show_notice(f"The reply failed: {event.message}")

    def _on_engine_error(self, event: EngineError) -> None:
        self.show_notice(f"Engine error: {event.message}")
