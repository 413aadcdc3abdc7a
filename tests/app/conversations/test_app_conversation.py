"""The conversation model: what the next request's history holds."""

from __future__ import annotations

import pytest

from app.conversations.conversation import Conversation
from engine.protocol.messages import ChatMessage


def test_history_holds_finished_turns_in_order_and_not_the_streaming_reply():
    conversation = Conversation()
    conversation.add_user_message("Hi")
    conversation.start_reply()
    conversation.append_to_reply("Hel")
    conversation.append_to_reply("lo")
    conversation.finish_reply("Hello")
    conversation.add_user_message("More")
    conversation.start_reply()

    assert conversation.history() == (
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello"),
        ChatMessage("user", "More"),
    )


def test_a_stopped_reply_keeps_its_text_and_a_failed_empty_one_is_left_out():
    conversation = Conversation()
    conversation.add_user_message("One")
    conversation.start_reply()
    conversation.finish_reply("Partial", interrupted=True)
    conversation.add_user_message("Two")
    conversation.start_reply()
    conversation.fail_reply("out of memory")

    assert [message.state for message in conversation.messages] == ["done", "interrupted", "done", "error"]
    assert conversation.messages[-1].error == "out of memory"
    assert [message.content for message in conversation.history()] == ["One", "Partial", "Two"]


def test_only_one_reply_streams_at_a_time():
    conversation = Conversation()
    conversation.add_user_message("Hi")
    conversation.start_reply()

    with pytest.raises(RuntimeError, match="already streaming"):
        conversation.start_reply()


def test_each_conversation_has_its_own_id():
    assert Conversation().id != Conversation().id
    assert Conversation("saved-7").id == "saved-7"
