"""Progress of one model load, with a Cancel button, for the status bar (GUI thread).

Shown while a load that ``track`` was told about runs: the engine's
``LoadProgress`` events move the bar (done of total, in the engine's unit).
Cancel sends ``Cancel`` for that load; the engine keeps the previous model and
answers ``LoadFailed``, which hides the bar like a finished load does.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QWidget

from app.controller import EngineController
from app.window.elided_label import ElidedLabel
from engine.protocol.messages import LoadFailed, LoadProgress, ModelLoaded


class LoadProgressBar(QWidget):
    """"Loading NAME [=====   ] 3 of 10 steps [Cancel]" while one load runs; hidden otherwise."""

    cancelled = Signal(str)
    """The user cancelled the load with this request id."""

    def __init__(self, controller: EngineController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("loadProgress")
        self._controller = controller
        self._request_id = ""
        self.label = ElidedLabel("", self)  # a long file name is cut, never widening the window
        self.bar = QProgressBar(self)
        self.bar.setFixedWidth(160)
        self.bar.setAccessibleName("Model loading progress")
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setAccessibleName("Cancel loading")
        self.cancel_button.clicked.connect(self.cancel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.label, self.bar, self.cancel_button):
            layout.addWidget(widget)
        controller.load_progress.connect(self._on_progress)
        controller.model_loaded.connect(self._on_finished)
        controller.load_failed.connect(self._on_finished)
        self.hide()

    @property
    def request_id(self) -> str:
        """The load being shown, or "" when none is."""
        return self._request_id

    def track(self, request_id: str, name: str) -> None:
        self._request_id = request_id
        self.label.set_text(f"Loading {name}")
        self.bar.setRange(0, 0)  # busy until the first LoadProgress says how many steps
        self.bar.setFormat("")
        self.cancel_button.setEnabled(True)
        self.cancel_button.setText("Cancel")
        self.show()

    def cancel(self) -> None:
        if self._request_id:
            self._controller.stop(self._request_id)
            self.cancelled.emit(self._request_id)
            self.cancel_button.setEnabled(False)
            self.cancel_button.setText("Cancelling…")

    def _on_progress(self, event: LoadProgress) -> None:
        if event.request_id != self._request_id or event.total <= 0:
            return
        self.bar.setRange(0, event.total)
        self.bar.setValue(event.done)
        self.bar.setFormat(f"%v of %m {event.unit}")

    def _on_finished(self, event: ModelLoaded | LoadFailed) -> None:
        if event.request_id == self._request_id:
            self._request_id = ""
            self.hide()
