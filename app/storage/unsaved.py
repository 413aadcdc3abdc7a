"""Finished replies whose final save failed, kept until a retry saves them (GUI thread).

When the disk is full, ``ChatStore.finish_reply`` cannot commit a reply's final text; the
store keeps it here instead of dropping it, retries it (``ChatStore.save_unsaved``: when the
window's timer asks, after the next reply is saved, and at ``close``), and tells whoever
watches (``watch``) a lasting warning until every kept reply is saved, then None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

Listener = Callable[[str | None], None]


@dataclass(frozen=True)
class UnsavedReply:
    """A reply's final text, state and statistics (as JSON) that are not in the database yet."""

    message_id: str
    text: str
    state: str
    stats_json: str | None
    reason: str  # why the last save failed: a ``StorageError``'s message


class UnsavedReplies:
    """The kept replies, in the order they failed, and the listeners of the warning about them."""

    def __init__(self) -> None:
        self._replies: dict[str, UnsavedReply] = {}
        self._listeners: list[Listener] = []

    def __iter__(self) -> Iterator[UnsavedReply]:
        return iter(list(self._replies.values()))

    def __bool__(self) -> bool:
        return bool(self._replies)

    @property
    def warning(self) -> str | None:
        """The lasting warning for the user while any reply is unsaved, else None."""
        if not self._replies:
            return None
        last = next(reversed(self._replies.values()))
        count = len(self._replies)
        replies = "the reply" if count == 1 else f"{count} replies"
        return (
            f"{last.reason} Hearth keeps trying to save {replies}: keep Hearth open until this warning "
            f"goes away, or the text on screen that is not saved yet will be lost."
        )

    def watch(self, listener: Listener) -> None:
        """Call ``listener`` with ``warning`` now and whenever it changes."""
        self._listeners.append(listener)
        listener(self.warning)

    def keep(self, reply: UnsavedReply) -> None:
        self._replies[reply.message_id] = reply
        self._tell()

    def saved(self, message_id: str) -> None:
        if self._replies.pop(message_id, None) is not None:
            self._tell()

    def _tell(self) -> None:
        warning = self.warning
        for listener in self._listeners:
            listener(warning)
