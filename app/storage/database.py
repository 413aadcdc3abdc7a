"""Opening the SQLite file: pragmas, migrations, and the policy for damaged files (GUI thread).

Damaged-file policy: ``connect`` never modifies, moves or deletes a file it cannot read; it
raises ``DamagedDatabaseError``. ``set_aside`` renames a damaged file (with its -wal/-shm
companions) to ``<name>.damaged-<YYYYmmdd-HHMMSS>`` next to it, so that a new empty database
can be started in its place while the old bytes stay available for recovery by hand.
Hearth never deletes a database file. A database file without owner write permission, or one
SQLite cannot write, is refused with ``ReadOnlyDatabaseError`` naming it (and left as it is).
"""

from __future__ import annotations

import sqlite3
import stat
import time
from pathlib import Path

from app.storage.errors import (
    DamagedDatabaseError, ReadOnlyDatabaseError, StorageError, describe, is_damage, is_read_only_error,
)
from app.storage.schema import check_version, migrate
from engine.host import paths

DATABASE_NAME = "hearth.sqlite3"
_COMPANION_SUFFIXES = ("-wal", "-shm")
_LOCK_TIMEOUT_S = 1.0
WAL_AUTOCHECKPOINT_PAGES = 100  # fold the write-ahead log back at ~400 KB, not SQLite's ~4 MB
JOURNAL_SIZE_LIMIT_BYTES = 512 * 1024  # and cut its file down to this after a fold


def default_database_path() -> Path:
    return paths.data_dir() / DATABASE_NAME


def connect(path: Path) -> sqlite3.Connection:
    """Open (or create) the database at ``path`` and migrate it to the current schema.

    Raises ``DamagedDatabaseError`` for a file that is not a readable database,
    ``NewerDatabaseError`` for one from a newer Hearth, ``ReadOnlyDatabaseError`` for one that
    cannot be written, ``StorageError`` for anything else.
    """
    _refuse_read_only_file(path)
    try:
        # A short lock timeout: this runs on the GUI thread, and a lock held for long means a second Hearth.
        connection = sqlite3.connect(path, isolation_level=None, timeout=_LOCK_TIMEOUT_S)
    except sqlite3.Error as error:
        raise StorageError(f"Could not open the conversation database {path}: {describe(error)}.") from error
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads the schema: finds damage
        check_version(connection)  # before anything is written, even the journal mode
        _configure(connection)
        migrate(connection)
        connection.execute("BEGIN IMMEDIATE")  # takes the write lock: finds a file SQLite cannot write
        connection.execute("ROLLBACK")
    except sqlite3.Error as error:
        connection.close()
        if is_damage(error):
            raise DamagedDatabaseError(path, str(error)) from error
        if is_read_only_error(error):
            raise ReadOnlyDatabaseError(path) from error
        raise StorageError(f"Could not open the conversation database {path}: {describe(error)}.") from error
    except BaseException:
        connection.close()
        raise
    return connection


def _configure(connection: sqlite3.Connection) -> None:
    # WAL + synchronous=NORMAL: a commit survives a crash or kill of the app (not always a power
    # cut), and commits are cheap enough to checkpoint a streamed reply every second.
    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StorageError(f"The database could not switch to write-ahead logging (mode is {mode}).")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
    connection.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}")


def _refuse_read_only_file(path: Path) -> None:
    """The user made the file read-only (no owner write permission): respect it, even where root could write."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not mode & stat.S_IWUSR:
        raise ReadOnlyDatabaseError(path)


def set_aside(path: Path) -> Path:
    """Rename a damaged database (and its -wal/-shm files) aside; return the new path of the main file."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    counter = 1
    while target.exists():
        counter += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{counter}")
    try:
        for suffix in _COMPANION_SUFFIXES:
            companion = path.with_name(path.name + suffix)
            if companion.exists():
                companion.rename(target.with_name(target.name + suffix))
        path.rename(target)
    except OSError as error:
        raise StorageError(f"Could not move the damaged database {path} aside: {error.strerror}.") from error
    return target
