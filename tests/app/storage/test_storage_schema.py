"""The database file format: pragmas, stable on-disk values, and opening every released version."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from app.storage import ChatStore, NewerDatabaseError
from app.storage.schema import SCHEMA_VERSION

FIXTURES = Path(__file__).with_name("fixtures")


def _copy_fixture(version: int, folder: Path) -> Path:
    target = folder / "hearth.sqlite3"
    shutil.copyfile(FIXTURES / f"v{version}.sqlite3", target)
    return target


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute("PRAGMA user_version").fetchone()[0]


def test_every_released_version_has_a_fixture() -> None:
    assert sorted(p.name for p in FIXTURES.glob("v*.sqlite3")) == sorted(
        f"v{v}.sqlite3" for v in range(1, SCHEMA_VERSION + 1)
    )


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_fixture_of_each_version_opens_with_its_content(version: int, tmp_path: Path) -> None:
    path = _copy_fixture(version, tmp_path)

    store = ChatStore.open(path)
    summaries = store.list_conversations()
    conversation = store.load_conversation(summaries[0].id)
    store.close()

    assert _user_version(path) == SCHEMA_VERSION
    assert [s.title for s in summaries] == ["Fireplaces"]
    assert conversation.system_prompt == "Be brief." and conversation.sampling is not None
    assert (conversation.sampling.temperature, conversation.sampling.seed) == (0.2, 7)
    assert [(m.role, m.state) for m in conversation.messages] == [
        ("user", "done"), ("assistant", "done"), ("user", "done"), ("assistant", "interrupted"),
    ]
    assert conversation.messages[1].dropped_from_context
    assert conversation.messages[1].stats is not None and conversation.messages[1].stats["prompt_tokens"] == 12
    assert not conversation.damaged


def test_database_from_a_newer_hearth_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    path = _copy_fixture(SCHEMA_VERSION, tmp_path)
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()

    with pytest.raises(NewerDatabaseError, match=f"schema version {SCHEMA_VERSION + 1}.*newer Hearth"):
        ChatStore.open(path)
    with pytest.raises(NewerDatabaseError):
        ChatStore.open_or_start_fresh(path)  # not "damaged": never moved aside

    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hearth.sqlite3"]


def test_new_database_uses_wal_normal_sync_and_foreign_keys(db_path: Path) -> None:
    store = ChatStore.open(db_path)
    connection = store._db  # inspecting the store's own connection: these pragmas are per connection
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert connection.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert _user_version(db_path) == SCHEMA_VERSION
    store.close()


def test_roles_and_states_are_stored_as_text(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "hi")
    store.finish_reply(store.begin_reply(conversation.id), "oops", state="error")

    with sqlite3.connect(db_path) as raw:
        rows = raw.execute("SELECT role, state, typeof(role), typeof(state) FROM messages ORDER BY position").fetchall()

    assert rows == [("user", "done", "text", "text"), ("assistant", "error", "text", "text")]


def test_purging_a_conversation_removes_its_messages(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "hi")
    store.delete_conversation(conversation.id)
    store.purge_deleted(timedelta(0))
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
