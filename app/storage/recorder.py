"""``ReplyRecorder``: saves a streamed reply at least once a second while it arrives (GUI thread).

The GUI feeds it each ``TokenStreamed.text``; a crash or ``kill -9`` then loses at most the last
second of the reply. ``ChatStore.recover_interrupted()`` at the next start marks what was left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.storage.store import ChatStore
from engine.protocol.messages import RequestStats

CHECKPOINT_INTERVAL_S = 1.0


class ReplyRecorder:
    """Accumulates one assistant reply and checkpoints it into the store.

    ``now`` values are seconds from one clock (``time.monotonic()`` in the app).
    A failed checkpoint raises ``StorageError``; the text stays in ``text`` and the next
    attempt comes a full interval later (not on every token).
    """

    def __init__(
        self, store: ChatStore, message_id: str, now: float, interval_s: float = CHECKPOINT_INTERVAL_S
    ) -> None:
        self.message_id = message_id
        self._store = store
        self._interval_s = interval_s
        self._parts: list[str] = []
        self._saved_length = 0
        self._length = 0
        self._last_checkpoint = now
        self._finished = False

    @classmethod
    def start(cls, store: ChatStore, conversation_id: str, now: float) -> ReplyRecorder:
        """Begin a reply in ``conversation_id`` (an empty 'streaming' message) and record into it."""
        return cls(store, store.begin_reply(conversation_id), now)

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def append(self, text: str, now: float) -> bool:
        """Add streamed text; checkpoint when ``interval_s`` has passed since the last one. True if it did."""
        if self._finished:
            raise RuntimeError("This reply was already finished.")
        self._parts.append(text)
        self._length += len(text)
        if now - self._last_checkpoint < self._interval_s:
            return False
        self._last_checkpoint = now
        return self.flush()

    def flush(self) -> bool:
        """Checkpoint now if there is unsaved text. True if it saved."""
        if self._finished or self._length == self._saved_length:
            return False
        text = self.text
        self._parts = [text]
        self._store.checkpoint_reply(self.message_id, text)
        self._saved_length = len(text)
        return True

    def finish(
        self,
        state: str = "done",
        stats: RequestStats | Mapping[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        """Commit the reply as final. ``text`` (e.g. ``ReplyFinished.text``) replaces what was appended."""
        final_text = self.text if text is None else text
        self._store.finish_reply(self.message_id, final_text, state, stats)
        self._finished = True
        self._parts = [final_text]
