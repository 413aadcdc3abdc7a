"""Cards made out of sight a page at a time, switching away from a long conversation, the banner above the cards."""

from __future__ import annotations

from PySide6.QtCore import QPoint

from app.chat.chat_view import ChatView
from app.chat.message_bubble import MessageBubble
from app.conversations.conversation import DisplayMessage


def _messages(count: int, prefix: str = "Message") -> tuple[DisplayMessage, ...]:
    return tuple(DisplayMessage("user" if i % 2 == 0 else "assistant", f"{prefix} {i}\n\nsome text") for i in range(count))


def _scroll_to_first(qtbot, view: ChatView, first: DisplayMessage) -> None:
    for _ in range(300):
        if view.bubbles and view.bubbles[0].message is first and not view.loading:
            return
        view.verticalScrollBar().setValue(0)
        qtbot.wait(5)
    raise AssertionError("the first message never got its card")


def test_a_message_deleted_before_its_card_is_shown_never_appears(qtbot, chat_view):
    view = chat_view
    messages = _messages(200)
    view.show_messages(messages)
    qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    view.verticalScrollBar().setValue(0)
    qtbot.wait(20)  # some older cards are being made, not all shown yet
    first_shown = messages.index(view.bubbles[0].message)
    deleted = messages[first_shown - 1]

    view.remove_message(deleted)
    _scroll_to_first(qtbot, view, messages[0])

    assert [bubble.message for bubble in view.bubbles] == [m for m in messages if m is not deleted]
    tops = [bubble.mapTo(view.widget(), QPoint(0, 0)).y() for bubble in view.bubbles]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)  # in order, none on top of another


def test_switching_away_from_a_long_conversation_shows_only_the_new_one_and_frees_the_old_cards(qtbot, chat_view):
    view = chat_view
    long_one = _messages(120)
    view.show_messages(long_one)
    _scroll_to_first(qtbot, view, long_one[0])
    short_one = _messages(3, prefix="Other")

    view.show_messages(short_one)
    qtbot.waitUntil(lambda: len(view.findChildren(MessageBubble)) == len(short_one), timeout=5000)

    bar = view.verticalScrollBar()
    assert [bubble.message for bubble in view.bubbles] == list(short_one)
    assert all(bubble.isVisible() for bubble in view.bubbles)
    assert bar.maximum() == 0 or bar.value() == bar.maximum()


def test_the_damage_banner_sits_above_the_first_card_and_moves_them_down(qtbot, chat_view):
    view = chat_view
    view.show_messages(_messages(2))
    qtbot.wait(20)
    first = view.bubbles[0]
    top_without = first.mapTo(view.widget(), QPoint(0, 0)).y()

    view.set_banner("Part of this conversation could not be read.")
    qtbot.wait(20)

    top_with = first.mapTo(view.widget(), QPoint(0, 0)).y()
    assert view.banner.isVisible()
    assert view.banner.geometry().bottom() < top_with
    assert top_with > top_without
