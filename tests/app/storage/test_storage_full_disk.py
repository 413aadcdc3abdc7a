"""A full disk never loses a finished reply while Hearth runs, and a read-only database is named."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage import ChatStore, ReadOnlyDatabaseError, ReplyRecorder, StorageError

REPLY = "Paris is the capital of France. " * 400  # 12 800 characters: more than a page holds


def fill_disk(store: ChatStore) -> None:
    """SQLite's page limit fails writes with SQLITE_FULL, a full disk's result code and code path."""
    page_count = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {page_count}")


def free_disk(store: ChatStore) -> None:
    store._db.execute("PRAGMA max_page_count = 1073741823")


def reply_on_full_disk(store: ChatStore) -> tuple[str, list[str | None]]:
    """A reply whose final save fails; its message id and the warnings the store gave."""
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "What is the capital of France?")
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    recorder.append(REPLY[:71], now=1.0)
    warnings: list[str | None] = []
    store.unsaved.watch(warnings.append)
    fill_disk(store)
    with pytest.raises(StorageError, match="disk is full"):
        recorder.finish("done", text=REPLY)
    return recorder.message_id, warnings


def saved_reply(db_path: Path, message_id: str) -> tuple[str, str]:
    reopened = ChatStore.open(db_path)
    try:
        conversation = reopened.list_conversations()[0].id
        message = next(m for m in reopened.load_conversation(conversation).messages if m.id == message_id)
        return message.content, message.state
    finally:
        reopened.close()


def test_unsaved_reply_is_warned_about_until_a_retry_saves_it(store: ChatStore, db_path: Path) -> None:
    message_id, warnings = reply_on_full_disk(store)
    assert warnings[0] is None and warnings[-1] is not None
    assert "disk is full" in warnings[-1] and "keeps trying" in warnings[-1]
    assert store.save_unsaved() is False and store.unsaved.warning == warnings[-1]

    free_disk(store)
    assert store.save_unsaved() is True
    assert warnings[-1] is None
    assert saved_reply(db_path, message_id) == (REPLY, "done")


def test_unsaved_reply_is_saved_by_the_next_saved_reply(store: ChatStore, db_path: Path) -> None:
    message_id, warnings = reply_on_full_disk(store)
    free_disk(store)
    conversation = store.list_conversations()[0].id
    ReplyRecorder.start(store, conversation, now=2.0).finish("done", text="Another reply.")
    assert warnings[-1] is None
    assert saved_reply(db_path, message_id) == (REPLY, "done")


def test_unsaved_reply_is_saved_at_a_clean_close(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    message_id, _ = reply_on_full_disk(store)
    free_disk(store)
    store.close()
    assert saved_reply(db_path, message_id) == (REPLY, "done")


def test_write_ahead_log_stays_small_through_a_long_reply(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    log = db_path.with_name(db_path.name + "-wal")
    largest = 0
    for second in range(1, 60):  # a reply growing to 120 KB, saved every second (6 MB written to the log)
        recorder.append("x" * 2000, now=float(second))
        largest = max(largest, log.stat().st_size)
    recorder.finish("done")
    assert largest < 1024**2  # SQLite's default lets it reach 4 MB


def test_write_ahead_log_is_emptied_to_make_room_for_a_failed_reply(store: ChatStore, db_path: Path) -> None:
    log = db_path.with_name(db_path.name + "-wal")
    assert log.stat().st_size > 0
    reply_on_full_disk(store)
    assert log.stat().st_size == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs (needs root and a kernel that lets this process mount)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_really_full_disk_keeps_the_reply_until_space_returns(small_disk: Path) -> None:
    db_path = small_disk / "hearth.sqlite3"
    store = ChatStore.open(db_path)
    conversation = store.create_conversation()
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    filler = small_disk / "filler"
    with filler.open("wb", buffering=0) as stream:  # every block the disk has left
        try:
            while True:
                stream.write(bytes(4096))
        except OSError:
            pass
    long_reply = "The capital of France is Paris. " * 4000  # 128 KB: more than is left
    with pytest.raises(StorageError, match="disk is full"):
        recorder.finish("done", text=long_reply)
    assert store.unsaved.warning is not None

    filler.unlink()
    assert store.save_unsaved() and store.unsaved.warning is None
    store.close()
    assert saved_reply(db_path, recorder.message_id) == (long_reply, "done")


def test_read_only_database_is_refused_by_name_and_left_as_it_is(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    store.create_conversation(title="kept")
    store.close()
    db_path.chmod(0o444)
    before = db_path.read_bytes()
    with pytest.raises(ReadOnlyDatabaseError, match=f"{db_path} is read-only"):
        ChatStore.open_or_start_fresh(db_path)
    assert db_path.read_bytes() == before
    assert not list(db_path.parent.glob("*.damaged-*"))
    os.chmod(db_path, 0o644)
    assert [c.title for c in ChatStore.open(db_path).list_conversations()] == ["kept"]
