"""Damaged rows, damaged files, a full disk and a read-only database: clear errors, nothing lost."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.storage import ChatStore, DamagedDatabaseError, ReplyRecorder, StorageError

GARBAGE = b"this is not a database, just some bytes a sync tool left here\n" * 50


def _raw_update(path: Path, sql: str, *parameters: object) -> None:
    with sqlite3.connect(path) as raw:
        raw.execute(sql, parameters)


def test_damaged_rows_mark_only_their_conversation(store: ChatStore, db_path: Path) -> None:
    healthy = store.create_conversation(title="healthy")
    store.add_user_message(healthy.id, "fine")
    broken = store.create_conversation(title="broken")
    store.add_user_message(broken.id, "question")
    reply = store.begin_reply(broken.id)
    store.finish_reply(reply, "answer", stats={"prompt_tokens": 3})
    odd = store.add_user_message(broken.id, "from the future")
    _raw_update(db_path, "UPDATE messages SET stats_json = '{not json' WHERE id = ?", reply)
    _raw_update(db_path, "UPDATE messages SET role = 'robot' WHERE id = ?", odd.id)
    _raw_update(db_path, "UPDATE conversations SET sampling_json = '[1, 2' WHERE id = ?", broken.id)

    loaded = store.load_conversation(broken.id)

    assert loaded.damaged
    assert "unknown role 'robot'" in loaded.damage_reason
    assert "statistics" in loaded.damage_reason and "sampling" in loaded.damage_reason
    assert [(m.content, m.stats) for m in loaded.messages] == [("question", None), ("answer", None)]
    assert loaded.sampling is None
    assert not store.load_conversation(healthy.id).damaged
    assert {c.title for c in store.list_conversations()} == {"healthy", "broken"}


def test_unknown_state_or_wrongly_typed_sampling_is_reported(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    message = store.add_user_message(conversation.id, "hi")
    _raw_update(db_path, "UPDATE messages SET state = 'thinking' WHERE id = ?", message.id)
    bad_sampling = """UPDATE conversations SET sampling_json = '{"top_k": "many"}' WHERE id = ?"""
    _raw_update(db_path, bad_sampling, conversation.id)

    loaded = store.load_conversation(conversation.id)

    assert loaded.messages == ()
    assert "unknown state 'thinking'" in loaded.damage_reason
    assert "top_k must be a number" in loaded.damage_reason


def test_garbage_file_is_refused_and_left_untouched(db_path: Path) -> None:
    db_path.write_bytes(GARBAGE)

    with pytest.raises(DamagedDatabaseError, match="is damaged .*not a database") as caught:
        ChatStore.open(db_path)

    assert caught.value.path == db_path
    assert db_path.read_bytes() == GARBAGE


def test_damaged_file_is_moved_aside_and_a_fresh_database_started(db_path: Path) -> None:
    db_path.write_bytes(GARBAGE)

    store, notice = ChatStore.open_or_start_fresh(db_path)

    kept = [p for p in db_path.parent.iterdir() if p.name.startswith("hearth.sqlite3.damaged-")]
    assert len(kept) == 1 and kept[0].read_bytes() == GARBAGE
    assert notice is not None and str(kept[0]) in notice and "nothing was deleted" in notice
    conversation = store.create_conversation(title="after the damage")
    store.close()
    assert [c.title for c in ChatStore.open(db_path).list_conversations()] == [conversation.title]


def test_database_with_a_damaged_schema_page_is_refused(store: ChatStore, db_path: Path) -> None:
    store.create_conversation(title="x")
    store.close()
    content = bytearray(db_path.read_bytes())
    content[100:4096] = b"\xff" * (4096 - 100)  # page 1 keeps its 100-byte header, loses sqlite_schema
    db_path.write_bytes(bytes(content))

    with pytest.raises(DamagedDatabaseError):
        ChatStore.open(db_path)


def test_full_disk_gives_a_clear_error_and_keeps_what_was_saved(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation(title="saved before")
    store.add_user_message(conversation.id, "an earlier message")
    # Simulation: SQLite's page limit makes it fail with SQLITE_FULL, the same result code and
    # code path as a full disk. The limit is per connection, so it is set on the store's own.
    page_count = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {page_count}")

    with pytest.raises(StorageError, match="Could not save your message: the disk is full"):
        store.add_user_message(conversation.id, "x" * 200_000)
    store.close()

    reopened = ChatStore.open(db_path).load_conversation(conversation.id)
    assert reopened.title == "saved before"
    assert [m.content for m in reopened.messages] == ["an earlier message"]


def test_recorder_keeps_the_text_when_a_checkpoint_fails(store: ChatStore) -> None:
    conversation = store.create_conversation()
    recorder = ReplyRecorder.start(store, conversation.id, now=0.0)
    page_count = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {page_count}")  # full disk, as above

    with pytest.raises(StorageError, match="disk is full"):
        recorder.append("y" * 200_000, now=1.0)
    assert recorder.append("z", now=1.5) is False  # no retry on every token
    assert recorder.text == "y" * 200_000 + "z"


def test_read_only_database_gives_a_clear_error_and_keeps_what_was_saved(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation(title="saved before")
    store.add_user_message(conversation.id, "kept")
    store.close()
    # Simulation: tests run as root, whom chmod does not stop, so the file is opened through
    # SQLite's read-only mode, which fails writes with SQLITE_READONLY as a read-only folder does.
    read_only = ChatStore(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None))

    expected = "Could not save your message: the data folder or database file is read-only"
    with pytest.raises(StorageError, match=expected):
        read_only.add_user_message(conversation.id, "lost?")
    assert [m.content for m in read_only.load_conversation(conversation.id).messages] == ["kept"]
    read_only.close()

    assert [m.content for m in ChatStore.open(db_path).load_conversation(conversation.id).messages] == ["kept"]


def test_folder_that_cannot_hold_the_database_gives_a_clear_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "data"
    not_a_folder.write_text("a file where the data folder should be")

    with pytest.raises(StorageError, match="Could not open the conversation database .*cannot be opened"):
        ChatStore.open(not_a_folder / "hearth.sqlite3")
    assert not_a_folder.read_text() == "a file where the data folder should be"
