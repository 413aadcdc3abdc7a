"""Exporting a conversation as Markdown and as JSON."""

from __future__ import annotations

import json

from app.storage import ChatStore, SamplingSettings, export_json, export_markdown
from engine.protocol.messages import RequestStats


def _conversation(store: ChatStore):
    conversation = store.create_conversation(system_prompt="Answer in haiku.", sampling=SamplingSettings(top_k=7))
    store.add_user_message(conversation.id, "Describe rain in Zürich")
    reply = store.begin_reply(conversation.id)
    store.finish_reply(reply, "Grey sky **softly** falls", stats=RequestStats(prompt_tokens=4))
    store.add_user_message(conversation.id, "Again")
    store.finish_reply(store.begin_reply(conversation.id), "Grey", state="interrupted")
    return store.load_conversation(conversation.id)


def test_markdown_has_title_prompt_and_turns_in_order(store: ChatStore) -> None:
    text = export_markdown(_conversation(store))

    assert text.startswith("# Describe rain in Zürich\n")
    assert "## System prompt\n\nAnswer in haiku." in text
    turns = ["## You\n\nDescribe rain in Zürich", "## Assistant\n\nGrey sky **softly** falls", "## You\n\nAgain"]
    positions = [text.index(turn) for turn in turns]
    assert positions == sorted(positions)
    assert text.rstrip().endswith("Grey\n\n*(reply interrupted)*")


def test_json_round_trips_every_message_field(store: ChatStore) -> None:
    conversation = _conversation(store)

    document = json.loads(export_json(conversation))

    assert document["format"] == "hearth-conversation" and document["id"] == conversation.id
    assert document["system_prompt"] == "Answer in haiku."
    assert document["sampling"]["top_k"] == 7
    assert [(m["role"], m["content"], m["state"]) for m in document["messages"]] == [
        (m.role, m.content, m.state) for m in conversation.messages
    ]
    assert document["messages"][1]["stats"]["prompt_tokens"] == 4
    assert "Zürich" in export_json(conversation)  # readable text, not \\u escapes
