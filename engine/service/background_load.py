"""Loads a new model on a helper thread while the engine thread keeps answering with the old one.

The helper thread builds the new model and touches nothing else; when it is done it
posts a ``LoadDone`` marker to the engine thread, which swaps the model in. Until
then the previous model keeps serving replies. Cancelling sets an event the
loader checks between its steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from engine.models.loading import LoadCancelled, LoadedModel
from engine.models.model_open import open_model
from engine.models.model_source import ModelFileError
from engine.protocol.channels import EventSink
from engine.protocol.messages import LoadModel, LoadProgress

CANCELLED_MESSAGE = "Loading was cancelled; the previous model stays."


@dataclass(frozen=True)
class LoadDone:
    """Engine-internal: the load ``request_id`` has finished (well or not). Never leaves the engine."""

    request_id: str


class BackgroundLoad:
    """One model load in flight; ``result`` or ``error`` is set before ``LoadDone`` is posted."""

    def __init__(self, request: LoadModel, emit: EventSink, post: Callable[[object], None]) -> None:
        self.request = request
        self.result: LoadedModel | None = None
        self.error: str | None = None
        self._emit = emit
        self._post = post
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _progress(self, done: int, total: int) -> None:
        self._emit(LoadProgress(self.request.request_id, done, total, "tensors"))

    def _run(self) -> None:
        try:
            self.result = open_model(
                self.request.path, self.request.options, self._emit, self._progress, self._cancel.is_set
            )
        except LoadCancelled:
            self.error = CANCELLED_MESSAGE
        except (ModelFileError, OSError, RuntimeError, ValueError, MemoryError) as exc:
            self.error = str(exc) or type(exc).__name__
        except Exception as exc:  # a loader bug must still end in a message, not a silent thread death
            self.error = f"Loading failed unexpectedly: {type(exc).__name__}: {exc}"
        if self._cancel.is_set() and self.error is None:
            self.result, self.error = None, CANCELLED_MESSAGE
        self._post(LoadDone(self.request.request_id))
