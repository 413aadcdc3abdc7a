"""Follows a prompt from the input bar to the engine and the reply back (GUI thread).

``ChatSession`` keeps the current ``Conversation`` and its cards in step with the
engine's events: it sends the history on Send, appends streamed text, and marks a
reply as stopped or broken off while keeping what was written. It refuses to send
(keeping the typed text) while no model is loaded or a reply is being written.
When loading another model fails, the engine keeps the previous one, and so does
the session: sending works again with it.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.chat_view import ChatView
from app.controller import EngineController
from app.conversation import Conversation
from app.input_box import InputBar
from app.message_bubble import MessageBubble
from engine.messages import (
    EngineError,
    LoadFailed,
    LoadOptions,
    ModelLoaded,
    ReplyFailed,
    ReplyFinished,
    TokenStreamed,
)


class ChatSession(QObject):
    """The conversation on screen and the one request, if any, writing into it."""

    notice = Signal(str)
    """Something the user should read, e.g. why Enter did not send."""

    def __init__(
        self,
        controller: EngineController,
        view: ChatView,
        input_bar: InputBar,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._controller = controller
        self._view = view
        self._input = input_bar
        self._conversation = Conversation()
        self._model_ready = False
        self._has_model = False
        self._active_request: str | None = None
        self._reply_bubble: MessageBubble | None = None
        self._connect()
        self._update_controls()

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    @property
    def generating(self) -> bool:
        return self._active_request is not None

    def show_conversation(self, conversation: Conversation) -> bool:
        """Switch to ``conversation``; refused (False) while a reply is being written."""
        if self.generating:
            self.notice.emit("Stop the reply first, then switch conversations.")
            return False
        self._conversation = conversation
        self._view.clear()
        for message in conversation.messages:
            self._view.add_message(message)
        return True

    def load_model(self, path: str, options: LoadOptions = LoadOptions()) -> str:
        """Load another model and return the request id; sending waits until it is loaded."""
        self.stop()
        self._model_ready = False
        self._update_controls()
        return self._controller.load_model(path, options)

    def send(self, text: str) -> bool:
        """Send ``text`` as the next user message; False (text kept) if not possible now."""
        if not text.strip():
            return False
        refusal = self._refusal()
        if refusal:
            self.notice.emit(refusal)
            return False
        self._view.add_message(self._conversation.add_user_message(text.strip()))
        history = self._conversation.history()
        self._reply_bubble = self._view.add_message(self._conversation.start_reply())
        self._active_request = self._controller.send_prompt(self._conversation.id, history)
        self._input.clear()
        self._update_controls()
        return True

    def stop(self) -> None:
        if self._active_request is not None:
            self._controller.stop(self._active_request)

    def _refusal(self) -> str:
        if not self._model_ready:
            return "The model is not loaded yet; your message is kept, send it once the model is ready."
        if self.generating:
            return "A reply is still being written; press Stop or wait, your message is kept."
        return ""

    def _connect(self) -> None:
        self._input.send_requested.connect(self.send)
        self._input.stop_requested.connect(self.stop)
        self._controller.model_loaded.connect(self._on_model_loaded)
        self._controller.load_failed.connect(self._on_load_failed)
        self._controller.token_streamed.connect(self._on_token)
        self._controller.reply_finished.connect(self._on_finished)
        self._controller.reply_failed.connect(self._on_failed)
        self._controller.engine_error.connect(self._on_engine_error)

    def _update_controls(self) -> None:
        self._input.set_ready(self._model_ready, self.generating)

    def _on_model_loaded(self, _event: ModelLoaded) -> None:
        self._model_ready = self._has_model = True
        self._update_controls()

    def _on_load_failed(self, _event: LoadFailed) -> None:
        self._model_ready = self._has_model
        self._update_controls()

    def _on_token(self, event: TokenStreamed) -> None:
        if event.request_id == self._active_request:
            self._conversation.append_to_reply(event.text)
            self._refresh_reply()

    def _on_finished(self, event: ReplyFinished) -> None:
        if event.request_id == self._active_request:
            self._conversation.finish_reply(event.text, interrupted=event.stats.finish_reason == "cancelled")
            self._end_reply()

    def _on_failed(self, event: ReplyFailed) -> None:
        if event.request_id == self._active_request:
            self._conversation.fail_reply(event.message, event.partial_text)
            self._end_reply()

    def _on_engine_error(self, event: EngineError) -> None:
        if self.generating:
            self._conversation.fail_reply(event.message)
            self._end_reply()

    def _end_reply(self) -> None:
        self._active_request = None
        self._refresh_reply()
        self._reply_bubble = None
        self._update_controls()

    def _refresh_reply(self) -> None:
        if self._reply_bubble is not None:
            self._reply_bubble.refresh()
