"""Many conversations at once: a reply streaming in one conversation does not hold up another.

Each reply streams into its own conversation and its own rows in the store, on screen or
not; Stop stops the reply of the conversation on screen; the sidebar marks the ones answering.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.conversations.sidebar import Sidebar

BIRD = tuple(f" bird{index}" for index in range(80))
TREE = tuple(f" tree{index}" for index in range(80))


@pytest.fixture
def two_replies(script):
    """Two slow replies, told apart by their words; the fake engine streams them interleaved."""
    script.replies_by_prompt = {"Name a bird": BIRD, "Name a tree": TREE}
    script.token_delay_s = 0.01
    script.interleave = True
    return script


def _new_conversation(chat) -> None:
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)


def _start_both(chat) -> tuple[str, str]:
    """Ask for a bird in one conversation and, while it answers, for a tree in a new one; their ids."""
    chat.wait_until_ready()
    chat.type_and_press_enter("Name a bird")
    birds = chat.window.session.conversation
    chat.qtbot.waitUntil(lambda: "bird2" in birds.messages[-1].content, timeout=5000)
    _new_conversation(chat)
    chat.wait_until_ready()
    chat.type_and_press_enter("Name a tree")
    trees = chat.window.session.conversation
    chat.qtbot.waitUntil(lambda: "tree2" in trees.messages[-1].content, timeout=5000)
    return birds.id, trees.id


def _open(chat, conversation_id: str) -> None:
    """Open the conversation from the list and wait for its cards (older ones may come a moment later)."""
    chat.window.conversations.open(conversation_id)
    chat.qtbot.waitUntil(lambda: len(chat.window.chat_view.bubbles) == 2, timeout=5000)  # a long reply may still grow


def _answering(chat) -> frozenset[str]:
    return chat.window.session.replies.answering


def _wait_until_all_replies_end(chat) -> None:
    chat.qtbot.waitUntil(lambda: not _answering(chat), timeout=10_000)


def _stored(chat, conversation_id: str) -> list[tuple[str, str, str]]:
    record = chat.window.journal.store.load_conversation(conversation_id)
    return [(message.role, message.content, message.state) for message in record.messages]


def test_two_conversations_stream_at_once_each_into_its_own_rows(chat, two_replies):
    birds, trees = _start_both(chat)
    bird_reply = chat.window.session.live_conversation(birds).messages[-1]
    birds_so_far = bird_reply.content
    chat.qtbot.waitUntil(lambda: "tree10" in chat.last_reply().content, timeout=5000)

    assert _answering(chat) == {birds, trees}
    assert bird_reply.content.startswith(birds_so_far) and len(bird_reply.content) > len(birds_so_far)
    _wait_until_all_replies_end(chat)
    assert _stored(chat, birds) == [("user", "Name a bird", "done"), ("assistant", "".join(BIRD), "done")]
    assert _stored(chat, trees) == [("user", "Name a tree", "done"), ("assistant", "".join(TREE), "done")]
    assert chat.shown_texts() == ["Name a tree", "".join(TREE).strip()]


def test_the_sidebar_marks_the_conversations_that_are_answering(chat, two_replies):
    sidebar = chat.window.findChild(Sidebar)
    _start_both(chat)

    assert sidebar.answering_titles() == ["Name a tree", "Name a bird"]
    chat.qtbot.waitUntil(lambda: sidebar.answering_titles() == [], timeout=10_000)
    assert sidebar.titles() == ["Name a tree", "Name a bird"]


def test_stop_stops_only_the_reply_on_screen(chat, two_replies):
    birds, trees = _start_both(chat)
    chat.qtbot.mouseClick(chat.window.input_bar.stop_button, Qt.MouseButton.LeftButton)
    chat.wait_until_reply_ends()

    assert _answering(chat) == {birds}
    stopped = chat.last_reply()
    assert stopped.state == "interrupted" and "tree2" in stopped.content and "tree59" not in stopped.content
    assert "Stopped" in chat.window.chat_view.bubbles[-1].note.text()
    assert chat.window.input_bar.send_button.isEnabled()
    _wait_until_all_replies_end(chat)
    assert _stored(chat, birds)[-1] == ("assistant", "".join(BIRD), "done")
    assert _stored(chat, trees)[-1] == ("assistant", stopped.content, "interrupted")


def test_switching_while_both_stream_shows_the_text_so_far_and_it_goes_on(chat, two_replies):
    birds, trees = _start_both(chat)
    _open(chat, birds)

    shown = chat.shown_texts()
    assert shown[0] == "Name a bird" and shown[-1].startswith("bird0 bird1 bird2")
    assert chat.window.input_bar.stop_button.isEnabled() and not chat.window.input_bar.send_button.isEnabled()
    chat.qtbot.waitUntil(lambda: len(chat.shown_texts()[-1]) > len(shown[-1]), timeout=5000)
    _open(chat, trees)
    assert chat.shown_texts()[0] == "Name a tree" and "bird" not in chat.shown_texts()[-1]
    chat.wait_until_reply_ends()

    assert chat.shown_texts()[-1] == "".join(TREE).strip()
    _wait_until_all_replies_end(chat)
    _open(chat, birds)
    assert chat.shown_texts() == ["Name a bird", "".join(BIRD).strip()]


def test_a_reply_that_ends_off_screen_is_saved_and_shown_when_opened(chat, script):
    script.reply_tokens = BIRD
    script.token_delay_s = 0.01
    chat.wait_until_ready()
    chat.type_and_press_enter("Name a bird")
    birds = chat.window.session.conversation.id
    _new_conversation(chat)

    assert chat.window.chat_view.bubbles == () and chat.window.input_bar.send_button.isEnabled()
    _wait_until_all_replies_end(chat)
    assert _stored(chat, birds)[-1] == ("assistant", "".join(BIRD), "done")
    _open(chat, birds)
    assert chat.shown_texts() == ["Name a bird", "".join(BIRD).strip()]
    assert chat.window.chat_view.bubbles[-1].note.text() == ""


def test_without_batching_the_second_reply_waits_for_the_first_then_streams(chat, script):
    script.replies_by_prompt = {"Name a bird": BIRD, "Name a tree": TREE}
    script.token_delay_s = 0.01
    chat.wait_until_ready()
    chat.type_and_press_enter("Name a bird")
    birds = chat.window.session.conversation.id
    _new_conversation(chat)
    chat.type_and_press_enter("Name a tree")
    trees = chat.window.session.conversation.id
    note = chat.window.chat_view.bubbles[-1].note

    chat.qtbot.waitUntil(lambda: note.text() == "waiting for its turn…", timeout=1000)
    assert _answering(chat) == {birds, trees}
    chat.qtbot.waitUntil(lambda: note.text() == "writing…", timeout=5000)
    assert _answering(chat) == {trees}  # it began once the first reply ended
    _wait_until_all_replies_end(chat)
    assert [generate.conversation_id for generate in script.generates] == [birds, trees]
    assert _stored(chat, birds)[-1] == ("assistant", "".join(BIRD), "done")
    assert _stored(chat, trees)[-1] == ("assistant", "".join(TREE), "done")


def test_a_reply_streaming_off_screen_is_checkpointed_as_it_goes(chat, script):
    script.reply_tokens = tuple(f" w{index}" for index in range(400))
    script.token_delay_s = 0.01
    chat.wait_until_ready()
    chat.type_and_press_enter("Tell me everything")
    talker = chat.window.session.conversation.id
    _new_conversation(chat)
    chat.qtbot.waitUntil(lambda: _stored(chat, talker)[-1][1].startswith(" w0 w1"), timeout=5000)

    role, content, state = _stored(chat, talker)[-1]
    assert (role, state) == ("assistant", "streaming")  # what a crash now would leave, marked interrupted at start
    chat.window.conversations.open(talker)
    chat.window.session.stop()
    chat.wait_until_reply_ends()


def test_a_conversation_that_is_answering_cannot_be_deleted(chat, two_replies):
    birds, _trees = _start_both(chat)
    chat.window.conversations.delete(birds)

    assert "stop its reply first" in chat.window.status_line.currentMessage()
    assert "Name a bird" in chat.sidebar_titles()
    _wait_until_all_replies_end(chat)
    chat.window.conversations.delete(birds)
    assert chat.sidebar_titles() == ["Name a tree"]


def test_an_engine_crash_ends_every_reply_it_was_writing_and_keeps_their_text(chat, two_replies):
    birds, trees = _start_both(chat)
    two_replies.crash = "the fake engine broke"
    _wait_until_all_replies_end(chat)

    for conversation_id, word in ((birds, "bird2"), (trees, "tree2")):
        role, content, state = _stored(chat, conversation_id)[-1]
        assert (role, state) == ("assistant", "error") and word in content
    assert chat.window.input_bar.send_button.isEnabled()


def test_regenerating_in_one_conversation_while_another_answers(chat, two_replies):
    chat.send_and_wait("Name a bird")
    birds = chat.window.session.conversation.id
    _new_conversation(chat)
    chat.type_and_press_enter("Name a tree")
    chat.qtbot.waitUntil(lambda: "tree2" in chat.last_reply().content, timeout=5000)
    trees = chat.window.session.conversation.id
    _open(chat, birds)
    two_replies.replies_by_prompt["Name a bird"] = (" Robin.",)
    assert _answering(chat) == {trees}
    menu = chat.window.chat_view.bubbles[1].actions_menu()
    next(action for action in menu.actions() if "Regenerate" in action.text()).trigger()

    chat.wait_until_reply_ends()
    assert _stored(chat, birds) == [("user", "Name a bird", "done"), ("assistant", " Robin.", "done")]
    assert chat.shown_texts() == ["Name a bird", "Robin."]
    _wait_until_all_replies_end(chat)
    assert _stored(chat, trees) == [("user", "Name a tree", "done"), ("assistant", "".join(TREE), "done")]


def test_a_long_prompt_says_how_much_of_it_was_read_before_the_reply_writes(chat, script):
    script.reading = ((4_000, 16_000), (8_000, 16_000))
    script.reply_tokens = ("A", " summary.")
    script.reading_delay_s = 0.3
    chat.wait_until_ready()
    chat.type_and_press_enter("Summarise this long text")
    note = chat.window.chat_view.bubbles[-1].note

    chat.qtbot.waitUntil(lambda: note.text() == "reading the conversation… 25 % of 16,000 tokens", timeout=2000)
    chat.qtbot.waitUntil(lambda: note.text() == "reading the conversation… 50 % of 16,000 tokens", timeout=2000)
    chat.wait_until_reply_ends()
    assert chat.shown_texts()[-1] == "A summary."
    assert note.text() == ""
