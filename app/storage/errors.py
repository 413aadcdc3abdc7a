"""Storage errors and the translation of SQLite failures into messages a user can act on (GUI thread).

Every public storage call that touches the disk raises ``StorageError`` (or a subclass) with a
sentence that says what could not be done and why; the underlying ``sqlite3`` error is chained.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class StorageError(Exception):
    """Something could not be read or saved; ``str(error)`` is the message to show the user."""


class NotFoundError(StorageError):
    """A conversation or message id that is not in the database."""


class DamagedDatabaseError(StorageError):
    """The database file is not a usable SQLite database. The file itself is left untouched."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"The conversation database {path} is damaged ({reason}). It was left as it is.")
        self.path = path
        self.reason = reason


class ReadOnlyDatabaseError(StorageError):
    """The database file cannot be written (read-only file, folder or disk). The file is left untouched."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"The conversation database {path} is read-only, so Hearth cannot save conversations in it. "
            f"Make the file and its folder writable, then start Hearth again."
        )
        self.path = path


class NewerDatabaseError(StorageError):
    """The database was written by a newer Hearth (its schema version is unknown here)."""


_REASONS: dict[int, str] = {
    sqlite3.SQLITE_FULL: "the disk is full. Free some space and try again; what was saved before is safe",
    sqlite3.SQLITE_READONLY: "the data folder or database file is read-only. "
    "Check its permissions; what was saved before is safe",
    sqlite3.SQLITE_IOERR: "the disk reported an input/output error",
    sqlite3.SQLITE_CORRUPT: "the database file is damaged",
    sqlite3.SQLITE_NOTADB: "the file is not a Hearth database (it may be damaged)",
    sqlite3.SQLITE_BUSY: "the database is locked by another program (is Hearth open twice?)",
    sqlite3.SQLITE_LOCKED: "the database is locked by another program (is Hearth open twice?)",
    sqlite3.SQLITE_CANTOPEN: "the file cannot be opened (does the folder exist and is it writable?)",
    sqlite3.SQLITE_PERM: "permission denied",
}


def describe(error: sqlite3.Error) -> str:
    """A short human explanation of a SQLite error, by its result code (not its wording)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return str(error)
    reason = _REASONS.get(code & 0xFF)  # extended codes keep the primary code in the low byte
    return reason if reason else f"{error} ({getattr(error, 'sqlite_errorname', code)})"


def is_read_only_error(error: sqlite3.Error) -> bool:
    """True when the error means the database (its file, folder or disk) cannot be written."""
    return getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_READONLY


def is_damage(error: sqlite3.Error) -> bool:
    """True when the error means the file itself is not a readable database."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


@contextmanager
def saving(what: str) -> Iterator[None]:
    """Turn any SQLite error inside the block into ``StorageError("Could not save <what>: ...")``."""
    try:
        yield
    except sqlite3.Error as error:
        raise StorageError(f"Could not save {what}: {describe(error)}.") from error


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Turn any SQLite error inside the block into ``StorageError("Could not read <what>: ...")``."""
    try:
        yield
    except sqlite3.Error as error:
        raise StorageError(f"Could not read {what}: {describe(error)}.") from error
