"""``ChatStore``: conversations and messages in SQLite, one small transaction per call (GUI thread).

Every write is committed before the call returns, so a crash loses nothing already handed to the
store; a streamed reply is checkpointed by ``ReplyRecorder`` (recorder.py). Reads and writes
raise ``StorageError`` with a message for the user; ``NotFoundError`` for an unknown id.

A reply's final save that fails (a full disk) still raises, but the store keeps the reply
(``unsaved``, unsaved.py) and saves it on ``save_unsaved``: the window retries on a timer,
and every later finished reply and ``close`` retry too. Each retry first folds the write-ahead
log back into the database and truncates it (the log is what fills a small disk first; the
connection also keeps it small, see ``database._configure``).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from app.storage import database
from app.storage.errors import DamagedDatabaseError, NotFoundError, StorageError, reading, saving
from app.storage.records import (
    FINAL_STATES,
    Conversation,
    ConversationSummary,
    Message,
    MessageState,
    ToolTurn,
    conversation_from_rows,
    message_from_row,
    summary_from_row,
    title_from_text,
    tool_calls_json,
    tool_json,
)
from app.storage.settings import SamplingSettings
from app.storage.unsaved import UnsavedReplies, UnsavedReply
from engine.protocol.messages import RequestStats, Role, ToolCall

Clock = Callable[[], float]
CUT_OFF_CALL = "Hearth stopped before this tool call finished; it has no result."
_NEWEST_FIRST = "ORDER BY updated_at DESC, rowid DESC"


class ChatStore:
    """The conversation database. Build it with ``ChatStore.open`` or ``ChatStore.open_or_start_fresh``."""

    def __init__(self, connection: sqlite3.Connection, clock: Clock = time.time) -> None:
        connection.row_factory = sqlite3.Row
        self._db = connection
        self._clock = clock
        self.unsaved = UnsavedReplies()
        """Finished replies not saved yet; ``unsaved.watch`` gives the lasting warning about them."""

    @classmethod
    def open(cls, path: Path | None = None, clock: Clock = time.time) -> ChatStore:
        """Open or create the database (default ``data_dir()/hearth.sqlite3``); see database.connect for errors."""
        return cls(database.connect(path or database.default_database_path()), clock)

    @classmethod
    def open_or_start_fresh(
        cls, path: Path | None = None, clock: Clock = time.time
    ) -> tuple[ChatStore, str | None]:
        """Open the database; if it is damaged, move it aside and start an empty one.

        Returns the store and, when the damaged file was moved aside, a notice for the user.
        Other ``StorageError``s (newer version, unwritable folder) propagate and touch nothing.
        """
        path = path or database.default_database_path()
        try:
            return cls.open(path, clock), None
        except DamagedDatabaseError as error:
            kept = database.set_aside(path)
            notice = (
                f"The conversation database was damaged ({error.reason}) and could not be opened. "
                f"It was kept as {kept} (nothing was deleted) and a new, empty one was started."
            )
            return cls.open(path, clock), notice

    def close(self) -> None:
        """Save what is unsaved if the disk allows, fold the write-ahead log back, and close."""
        self.save_unsaved()
        self._fold_log()
        self._db.close()

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        with saving(what):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------ conversations

    def create_conversation(
        self, title: str | None = None, system_prompt: str = "", sampling: SamplingSettings | None = None
    ) -> Conversation:
        """A new empty conversation; without ``title`` it is named after its first user message."""
        conversation_id, now = uuid.uuid4().hex, self._clock()
        clean_title = " ".join((title or "").split())
        with self._transaction("the new conversation") as db:
            db.execute(
                "INSERT INTO conversations (id, title, title_set_by_user, created_at, updated_at,"
                " system_prompt, sampling_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, clean_title, bool(clean_title), now, now, system_prompt, _sampling_json(sampling)),
            )
        return Conversation(
            conversation_id, clean_title, bool(clean_title), now, now, system_prompt, sampling, None, ()
        )

    def list_conversations(self) -> list[ConversationSummary]:
        """Conversations not deleted, most recently updated first."""
        with reading("the conversation list"):
            rows = self._db.execute(f"SELECT * FROM conversations WHERE deleted_at IS NULL {_NEWEST_FIRST}").fetchall()
        return [summary_from_row(row) for row in rows]

    def search(self, text: str) -> list[ConversationSummary]:
        """Conversations (not deleted) whose title or any message contains ``text`` (case-insensitive for ASCII)."""
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        query = (
            "SELECT * FROM conversations c WHERE deleted_at IS NULL AND (title LIKE :p ESCAPE '\\'"
            " OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE :p ESCAPE '\\'))"
            f" {_NEWEST_FIRST}"
        )
        with reading("the search results"):
            rows = self._db.execute(query, {"p": pattern}).fetchall()
        return [summary_from_row(row) for row in rows]

    def rename(self, conversation_id: str, title: str) -> None:
        """Set a title chosen by the user; a blank title returns to the automatic one."""
        clean_title = " ".join(title.split())
        with self._transaction("the new title") as db:
            self._require_conversation(db, conversation_id)
            if not clean_title:
                clean_title = self._automatic_title(db, conversation_id)
            db.execute(
                "UPDATE conversations SET title = ?, title_set_by_user = ?, updated_at = ? WHERE id = ?",
                (clean_title, bool(title.strip()), self._clock(), conversation_id),
            )

    def set_conversation_settings(
        self, conversation_id: str, system_prompt: str, sampling: SamplingSettings | None,
        reply_kind: str = "text", reply_schema: str = "", use_tools: bool = False,
    ) -> None:
        """Replace the conversation's system prompt, sampling (None: follow the global defaults), reply format
        (``records.Conversation.reply_kind``) and whether its replies may call tools."""
        with self._transaction("the conversation settings") as db:
            self._require_conversation(db, conversation_id)
            db.execute(
                "UPDATE conversations SET system_prompt = ?, sampling_json = ?, reply_kind = ?, reply_schema = ?,"
                " use_tools = ?, updated_at = ? WHERE id = ?",
                (system_prompt, _sampling_json(sampling), reply_kind, reply_schema, use_tools, self._clock(),
                 conversation_id),
            )

    def delete_conversation(self, conversation_id: str) -> None:
        """Hide the conversation (soft delete); ``undo_delete`` brings it back until it is purged."""
        self._set_deleted(conversation_id, self._clock(), "the deletion")

    def undo_delete(self, conversation_id: str) -> None:
        self._set_deleted(conversation_id, None, "the restored conversation")

    def _set_deleted(self, conversation_id: str, deleted_at: float | None, what: str) -> None:
        with self._transaction(what) as db:
            self._require_conversation(db, conversation_id)
            db.execute("UPDATE conversations SET deleted_at = ? WHERE id = ?", (deleted_at, conversation_id))

    def purge_deleted(self, older_than: timedelta) -> list[str]:
        """Remove for good the conversations deleted more than ``older_than`` ago; return their ids."""
        cutoff = self._clock() - older_than.total_seconds()
        with self._transaction("the purge of deleted conversations") as db:
            rows = db.execute("SELECT id FROM conversations WHERE deleted_at <= ?", (cutoff,)).fetchall()
            db.execute("DELETE FROM conversations WHERE deleted_at <= ?", (cutoff,))
        return [row["id"] for row in rows]

    def load_conversation(self, conversation_id: str) -> Conversation:
        """The conversation with its messages; unreadable rows are reported in ``problems``, not raised."""
        with reading("the conversation"):
            row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"There is no conversation with id {conversation_id}.")
            message_rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position", (conversation_id,)
            ).fetchall()
        return conversation_from_rows(row, message_rows)

    # ------------------------------------------------------------ messages

    def add_user_message(self, conversation_id: str, text: str) -> Message:
        """Append a user message (committed now); the first one names an untitled conversation."""
        with self._transaction("your message") as db:
            message = self._append(db, conversation_id, "user", text, "done")
            db.execute(
                "UPDATE conversations SET title = ? WHERE id = ? AND title_set_by_user = 0 AND title = ''",
                (title_from_text(text), conversation_id),
            )
        return message

    def begin_reply(self, conversation_id: str) -> str:
        """Append an empty assistant message in state 'streaming'; return its id."""
        with self._transaction("the start of the reply") as db:
            return self._append(db, conversation_id, "assistant", "", "streaming").id

    def checkpoint_reply(self, message_id: str, text: str) -> None:
        """Save the reply's text so far; the message stays 'streaming'."""
        with self._transaction("the reply so far") as db:
            cursor = db.execute(
                "UPDATE messages SET content = ? WHERE id = ? AND state = 'streaming'", (text, message_id)
            )
            if cursor.rowcount == 0:
                raise NotFoundError(f"There is no reply being written with id {message_id}.")

    def finish_reply(
        self,
        message_id: str,
        text: str,
        state: str = "done",
        stats: RequestStats | Mapping[str, Any] | None = None,
    ) -> None:
        """Save the reply's final text, its state ('done', 'interrupted' or 'error') and its statistics.

        When the save fails (other than for an unknown id), even after the write-ahead log is
        folded back, the reply is kept in ``unsaved`` and ``StorageError`` is raised; a success
        also retries the replies kept before.
        """
        if state not in FINAL_STATES:
            raise ValueError(f"A finished reply's state must be one of {sorted(FINAL_STATES)}, not {state!r}.")
        stats_json = None if stats is None else json.dumps(_stats_dict(stats))
        try:
            self._save_final(message_id, text, state, stats_json)
        except NotFoundError:
            raise
        except StorageError as error:
            self.unsaved.keep(UnsavedReply(message_id, text, state, stats_json, str(error)))
            if not self.save_unsaved():  # folding the write-ahead log back may free the space it needs
                raise
            return
        self.save_unsaved()

    def save_unsaved(self) -> bool:
        """Try again to save the replies in ``unsaved``, oldest first; True when none is left."""
        if self.unsaved:
            self._fold_log()  # a truncated write-ahead log may be the space the retry needs
        for reply in self.unsaved:
            try:
                self._save_final(reply.message_id, reply.text, reply.state, reply.stats_json)
            except NotFoundError:  # deleted since (the conversation was truncated or purged)
                pass
            except StorageError:
                return False
            self.unsaved.saved(reply.message_id)
        return True

    def _save_final(self, message_id: str, text: str, state: str, stats_json: str | None) -> None:
        with self._transaction("the reply") as db:
            row = self._require_message(db, message_id)
            db.execute(
                "UPDATE messages SET content = ?, state = ?, stats_json = ? WHERE id = ?",
                (text, state, stats_json, message_id),
            )
            self._touch(db, row["conversation_id"])

    def set_tool_calls(self, message_id: str, calls: tuple[ToolCall, ...]) -> None:
        """Save the tools a finished assistant reply called."""
        with self._transaction("the reply's tool calls") as db:
            self._require_message(db, message_id)
            db.execute("UPDATE messages SET tool_calls_json = ? WHERE id = ?", (tool_calls_json(calls), message_id))

    def add_tool_turn(self, conversation_id: str, turn: ToolTurn, text: str = "") -> Message:
        """Append a "tool" message: the call ``turn`` and its result ``text`` so far."""
        with self._transaction("the tool call") as db:
            message = self._append(db, conversation_id, "tool", text, "done")
            db.execute("UPDATE messages SET tool_json = ? WHERE id = ?", (tool_json(turn), message.id))
        return dataclasses.replace(message, tool=turn)

    def update_tool_turn(self, message_id: str, turn: ToolTurn, text: str) -> None:
        """Save how a tool call stands now, and its result ``text``."""
        with self._transaction("the tool call's result") as db:
            row = self._require_message(db, message_id)
            db.execute("UPDATE messages SET tool_json = ?, content = ? WHERE id = ?", (tool_json(turn), text, message_id))
            self._touch(db, row["conversation_id"])

    def _fold_log(self) -> None:
        """Copy the write-ahead log into the database and truncate it; a failure leaves it for the next time."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            pass

    def truncate_after(self, conversation_id: str, position: int) -> int:
        """Delete the messages after ``position`` (for edit/regenerate); return how many were deleted.

        Regenerate: ``truncate_after(cid, user_message.position)`` then ``begin_reply``.
        Edit: ``truncate_after(cid, edited.position - 1)`` then ``add_user_message(cid, new_text)``.
        """
        with self._transaction("the shortened conversation") as db:
            self._require_conversation(db, conversation_id)
            cursor = db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position > ?", (conversation_id, position)
            )
            self._touch(db, conversation_id)
        return cursor.rowcount

    def delete_message(self, message_id: str) -> None:
        with self._transaction("the deletion of the message") as db:
            row = self._require_message(db, message_id)
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            self._touch(db, row["conversation_id"])

    def set_dropped(self, message_ids: Iterable[str], dropped: bool = True) -> None:
        """Mark messages as left out of (or back in) the model's context window."""
        with self._transaction("which messages are in the context") as db:
            db.executemany(
                "UPDATE messages SET dropped_from_context = ? WHERE id = ?", ((dropped, i) for i in message_ids)
            )

    def recover_interrupted(self) -> list[Message]:
        """Mark replies left 'streaming' by a crash as 'interrupted' (text kept), and tool calls left waiting or
        running as stopped (``CUT_OFF_CALL``); return the replies. Call at start."""
        with self._transaction("the recovered replies") as db:
            rows = db.execute("SELECT * FROM messages WHERE state = 'streaming'").fetchall()
            db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
            self._stop_pending_tool_turns(db)
        found = (message_from_row(row)[0] for row in rows)
        return [dataclasses.replace(m, state="interrupted") for m in found if m is not None]

    @staticmethod
    def _stop_pending_tool_turns(db: sqlite3.Connection) -> None:
        for row in db.execute("SELECT * FROM messages WHERE role = 'tool'").fetchall():
            message, _problems = message_from_row(row)
            if message is not None and message.tool is not None and message.tool.pending:
                stopped = tool_json(dataclasses.replace(message.tool, status="stopped"))
                db.execute("UPDATE messages SET tool_json = ?, content = ? WHERE id = ?", (stopped, CUT_OFF_CALL, row["id"]))

    # ------------------------------------------------------------ helpers (inside a transaction)

    def _append(
        self, db: sqlite3.Connection, conversation_id: str, role: Role, text: str, state: MessageState
    ) -> Message:
        self._require_conversation(db, conversation_id)
        position = db.execute(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()[0]
        message = Message(uuid.uuid4().hex, conversation_id, position, role, text, state, self._clock())
        db.execute(
            "INSERT INTO messages (id, conversation_id, position, role, content, state, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (message.id, conversation_id, position, role, text, state, message.created_at),
        )
        self._touch(db, conversation_id)
        return message

    def _touch(self, db: sqlite3.Connection, conversation_id: str) -> None:
        db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (self._clock(), conversation_id))

    def _automatic_title(self, db: sqlite3.Connection, conversation_id: str) -> str:
        row = db.execute(
            "SELECT content FROM messages WHERE conversation_id = ? AND role = 'user' ORDER BY position LIMIT 1",
            (conversation_id,),
        ).fetchone()
        return title_from_text(row["content"]) if row else ""

    @staticmethod
    def _require_conversation(db: sqlite3.Connection, conversation_id: str) -> None:
        if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
            raise NotFoundError(f"There is no conversation with id {conversation_id}.")

    @staticmethod
    def _require_message(db: sqlite3.Connection, message_id: str) -> sqlite3.Row:
        row = db.execute("SELECT conversation_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"There is no message with id {message_id}.")
        return row


def _sampling_json(sampling: SamplingSettings | None) -> str | None:
    return None if sampling is None else json.dumps(sampling.to_dict())


def _stats_dict(stats: RequestStats | Mapping[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(stats) if isinstance(stats, RequestStats) else dict(stats)
