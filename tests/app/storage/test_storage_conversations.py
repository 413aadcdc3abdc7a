"""Conversations and messages through ChatStore: what the sidebar and the chat view will show."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from app.storage import ChatStore, NotFoundError, SamplingSettings


def test_saved_conversation_comes_back_after_reopening(store: ChatStore, db_path: Path) -> None:
    conversation = store.create_conversation(system_prompt="Be terse.", sampling=SamplingSettings(temperature=0.1))
    store.add_user_message(conversation.id, "Hello?")
    reply = store.begin_reply(conversation.id)
    store.finish_reply(reply, "Hi.")
    store.close()

    loaded = ChatStore.open(db_path).load_conversation(conversation.id)

    assert [(m.role, m.content, m.state) for m in loaded.messages] == [
        ("user", "Hello?", "done"),
        ("assistant", "Hi.", "done"),
    ]
    assert [m.position for m in loaded.messages] == [0, 1]
    assert loaded.system_prompt == "Be terse."
    assert loaded.sampling == SamplingSettings(temperature=0.1)
    assert not loaded.damaged


def test_list_is_newest_activity_first_and_hides_deleted(store: ChatStore) -> None:
    first = store.create_conversation(title="first")
    second = store.create_conversation(title="second")
    third = store.create_conversation(title="third")
    store.add_user_message(first.id, "bump")  # first is now the most recently updated
    store.delete_conversation(second.id)

    assert [c.title for c in store.list_conversations()] == ["first", "third"]
    store.undo_delete(second.id)  # back in its old place: undo is not new activity
    assert [c.id for c in store.list_conversations()] == [first.id, third.id, second.id]


def test_undo_delete_restores_conversation_with_messages(store: ChatStore) -> None:
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "keep me")
    store.delete_conversation(conversation.id)
    assert store.list_conversations() == []

    store.undo_delete(conversation.id)

    assert [c.id for c in store.list_conversations()] == [conversation.id]
    assert store.load_conversation(conversation.id).messages[0].content == "keep me"


def test_purge_removes_only_conversations_deleted_long_enough_ago(store: ChatStore, clock) -> None:
    old = store.create_conversation(title="old")
    store.add_user_message(old.id, "old message")
    store.delete_conversation(old.id)
    clock.now += 3 * 24 * 3600
    recent = store.create_conversation(title="recent")
    store.delete_conversation(recent.id)

    purged = store.purge_deleted(older_than=timedelta(days=1))

    assert purged == [old.id]
    with pytest.raises(NotFoundError):
        store.load_conversation(old.id)
    store.undo_delete(recent.id)
    assert [c.title for c in store.list_conversations()] == ["recent"]


def test_search_matches_titles_and_message_text_but_not_deleted(store: ChatStore) -> None:
    by_title = store.create_conversation(title="Sourdough starter")
    by_message = store.create_conversation(title="Kitchen")
    store.add_user_message(by_message.id, "How long to proof SOURDOUGH?")
    unrelated = store.create_conversation(title="Taxes")
    store.add_user_message(unrelated.id, "deductions")
    deleted = store.create_conversation(title="sourdough again")
    store.delete_conversation(deleted.id)

    assert {c.id for c in store.search("sourdough")} == {by_title.id, by_message.id}
    assert store.search("100%") == []


def test_search_treats_wildcards_literally(store: ChatStore) -> None:
    literal = store.create_conversation(title="a_b")
    store.create_conversation(title="axb")
    assert [c.id for c in store.search("a_b")] == [literal.id]


def test_first_user_message_names_the_conversation_on_one_short_line(store: ChatStore) -> None:
    conversation = store.create_conversation()
    long_text = "Explain   the difference\nbetween " + "very " * 30 + "long things"
    store.add_user_message(conversation.id, long_text)
    store.add_user_message(conversation.id, "second message does not rename")

    title = store.load_conversation(conversation.id).title
    assert "\n" not in title and "  " not in title
    assert len(title) <= 60
    assert title.startswith("Explain the difference between very")
    assert title.endswith("…")


def test_user_title_is_kept_and_blank_rename_returns_to_automatic(store: ChatStore) -> None:
    conversation = store.create_conversation()
    store.rename(conversation.id, "My  plans ")
    store.add_user_message(conversation.id, "What should I cook?")
    assert store.load_conversation(conversation.id).title == "My plans"

    store.rename(conversation.id, "   ")

    reloaded = store.load_conversation(conversation.id)
    assert reloaded.title == "What should I cook?"
    assert not reloaded.title_set_by_user


def test_regenerate_replaces_later_turns(store: ChatStore) -> None:
    conversation = store.create_conversation()
    question = store.add_user_message(conversation.id, "Q1")
    store.finish_reply(store.begin_reply(conversation.id), "A1")
    store.add_user_message(conversation.id, "Q2")
    store.finish_reply(store.begin_reply(conversation.id), "A2")

    removed = store.truncate_after(conversation.id, question.position)
    store.finish_reply(store.begin_reply(conversation.id), "A1 again")

    assert removed == 3
    contents = [m.content for m in store.load_conversation(conversation.id).messages]
    assert contents == ["Q1", "A1 again"]


def test_edit_replaces_the_edited_message_and_what_followed(store: ChatStore) -> None:
    conversation = store.create_conversation()
    store.add_user_message(conversation.id, "Q1")
    store.finish_reply(store.begin_reply(conversation.id), "A1")
    edited = store.add_user_message(conversation.id, "Q2 with typo")
    store.finish_reply(store.begin_reply(conversation.id), "A2")

    store.truncate_after(conversation.id, edited.position - 1)
    store.add_user_message(conversation.id, "Q2 fixed")

    messages = store.load_conversation(conversation.id).messages
    assert [m.content for m in messages] == ["Q1", "A1", "Q2 fixed"]
    assert [m.position for m in messages] == [0, 1, 2]


def test_delete_message_and_dropped_flag(store: ChatStore) -> None:
    conversation = store.create_conversation()
    first = store.add_user_message(conversation.id, "one")
    second = store.add_user_message(conversation.id, "two")
    third = store.add_user_message(conversation.id, "three")

    store.delete_message(second.id)
    store.set_dropped([first.id])
    messages = store.load_conversation(conversation.id).messages

    assert [(m.content, m.dropped_from_context) for m in messages] == [("one", True), ("three", False)]
    store.set_dropped([first.id], dropped=False)
    assert not store.load_conversation(conversation.id).messages[0].dropped_from_context
    assert store.add_user_message(conversation.id, "four").position == third.position + 1


def test_conversation_settings_can_change_and_follow_defaults(store: ChatStore) -> None:
    conversation = store.create_conversation(sampling=SamplingSettings(top_k=5))
    store.set_conversation_settings(conversation.id, "Speak French.", None)
    loaded = store.load_conversation(conversation.id)
    assert (loaded.system_prompt, loaded.sampling) == ("Speak French.", None)


def test_unknown_ids_give_a_clear_error(store: ChatStore) -> None:
    with pytest.raises(NotFoundError, match="no conversation with id nope"):
        store.add_user_message("nope", "hello")
    with pytest.raises(NotFoundError, match="no message"):
        store.delete_message("nope")
    with pytest.raises(NotFoundError):
        store.rename("nope", "x")
