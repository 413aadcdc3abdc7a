"""The database schema and its migrations, applied in order at open (GUI thread).

The schema version lives in ``PRAGMA user_version``. ``MIGRATIONS[i]`` turns a version ``i``
database into version ``i + 1``; a migration, once released, is never edited, only followed by
new ones (and a fixture of the released version is committed under tests/app/storage/fixtures/).
Enumerated values (roles, message states) are stored as stable TEXT, never as integers.
Times are Unix seconds (REAL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from app.storage.errors import NewerDatabaseError

_V1_STATEMENTS = (
    """CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        title_set_by_user INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        sampling_json TEXT,
        deleted_at REAL
    )""",
    """CREATE TABLE messages (
        id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        stats_json TEXT,
        dropped_from_context INTEGER NOT NULL DEFAULT 0,
        UNIQUE (conversation_id, position)
    )""",
    "CREATE INDEX conversations_by_update ON conversations (deleted_at, updated_at)",
    "CREATE INDEX messages_streaming ON messages (state) WHERE state = 'streaming'",
)


def _create_v1(connection: sqlite3.Connection) -> None:
    for statement in _V1_STATEMENTS:
        connection.execute(statement)


_V2_STATEMENTS = (
    "ALTER TABLE conversations ADD COLUMN reply_kind TEXT NOT NULL DEFAULT 'text'",
    "ALTER TABLE conversations ADD COLUMN reply_schema TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE conversations ADD COLUMN use_tools INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE messages ADD COLUMN tool_calls_json TEXT",
    "ALTER TABLE messages ADD COLUMN tool_json TEXT",
)


def _add_reply_format_and_tools(connection: sqlite3.Connection) -> None:
    """Version 2: each conversation's reply format and "Use tools"; an assistant turn's tool calls, and the
    "tool" turns that answer them (the call and how it went as JSON; the result is the message's content)."""
    for statement in _V2_STATEMENTS:
        connection.execute(statement)


Migration = Callable[[sqlite3.Connection], None]

MIGRATIONS: tuple[Migration, ...] = (_create_v1, _add_reply_format_and_tools)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA user_version").fetchone()[0])


def check_version(connection: sqlite3.Connection) -> int:
    """The file's schema version; ``NewerDatabaseError`` when it is from a newer Hearth. Writes nothing."""
    version = schema_version(connection)
    if version > SCHEMA_VERSION:
        raise NewerDatabaseError(
            f"This conversation database has schema version {version}, but this Hearth only knows "
            f"versions up to {SCHEMA_VERSION}. It was written by a newer Hearth: update Hearth to "
            "open it. The file was left unchanged."
        )
    return version


def migrate(connection: sqlite3.Connection) -> None:
    """Bring the database to ``SCHEMA_VERSION``, one committed step per migration."""
    version = check_version(connection)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        connection.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[target - 1](connection)
            connection.execute(f"PRAGMA user_version = {target}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
