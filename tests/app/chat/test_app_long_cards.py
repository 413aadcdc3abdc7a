"""Long replies get their cards in slices: they end up whole, act on the whole message meanwhile, and move nothing the user reads."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QPoint
from PySide6.QtGui import QGuiApplication

from app.chat.chat_view import ChatView
from app.chat.message_bubble import MessageBubble
from app.conversations.conversation import DisplayMessage


def _long_reply() -> str:
    prose = [f"Paragraph {n} explains *why* the `cache` matters for part {n}. " * 4 for n in range(8)]
    first_code = "```python\n" + "\n".join(f"value_{n} = compute(step={n}, scale={n * 3})  # line {n}" for n in range(40)) + "\n```"
    second_code = "```bash\n" + "\n".join(f"echo step {n}" for n in range(12)) + "\n```"
    points = "\n".join(f"- Point {n}: keep case {n} in mind." for n in range(8))
    return "\n\n".join([*prose, first_code, *prose[:3], second_code, points, "The very last sentence."])


def _top(view: ChatView, bubble: MessageBubble) -> int:
    return bubble.mapTo(view.widget(), QPoint(0, 0)).y()


def _lay_out_now() -> None:
    for _ in range(4):  # a card's page, its book, the column, the scroll area
        QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)


def test_a_long_reply_ends_up_fully_shown_with_a_copy_link_on_every_code_block(qtbot, chat_view):
    view = chat_view
    reply = DisplayMessage("assistant", _long_reply())
    view.show_messages((DisplayMessage("user", "Explain it all"), reply))
    card = view.bubble_for(reply)
    assert not card.complete  # made with only its start

    qtbot.waitUntil(lambda: not view.loading, timeout=5000)

    assert card.complete
    assert card.shown_text().rstrip().endswith("The very last sentence.")
    assert "Point 7: keep case 7 in mind." in card.shown_text()
    html = card.body.toHtml()
    assert "copy-code:0" in html and "copy-code:1" in html


def test_copying_a_card_that_is_still_growing_copies_the_whole_message(qtbot, chat_view):
    view = chat_view
    reply = DisplayMessage("assistant", _long_reply())
    view.show_messages((reply,))
    card = view.bubble_for(reply)
    assert "The very last sentence." not in card.shown_text()

    card.copy_button.click()

    assert QGuiApplication.clipboard().text() == reply.content


def test_a_conversation_whose_newest_reply_is_long_opens_at_the_end_of_that_reply(qtbot, chat_view):
    view = chat_view
    messages = tuple(DisplayMessage("user" if i % 2 == 0 else "assistant", f"Message {i}") for i in range(20))
    reply = DisplayMessage("assistant", _long_reply())
    view.show_messages((*messages, DisplayMessage("user", "And now?"), reply))

    bar, card = view.verticalScrollBar(), view.bubble_for(reply)

    def end_of_reply_in_view() -> bool:
        return card.complete and _top(view, card) + card.height() <= bar.value() + view.viewport().height()

    qtbot.waitUntil(end_of_reply_in_view, timeout=5000)
    assert bar.maximum() > 0 and bar.value() == bar.maximum()


def test_the_card_being_read_stays_in_place_while_a_long_card_above_it_grows(qtbot, chat_view):
    view = chat_view
    reply = DisplayMessage("assistant", _long_reply())
    later = tuple(DisplayMessage("user" if i % 2 == 0 else "assistant", f"Message {i}\n\nsome text") for i in range(60))
    view.show_messages((DisplayMessage("user", "Explain it all"), reply, *later))
    qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    bar = view.verticalScrollBar()
    for _ in range(600):  # scroll up until the long card is on screen above the text read, still growing
        card = view.bubble_for(reply)
        if card is not None and card.isVisibleTo(view.widget()) and not card.complete:
            break
        bar.setValue(bar.value() - 40)
        qtbot.wait(2)
    else:
        raise AssertionError("the long card was never shown while growing")
    _lay_out_now()  # what was just shown takes its place, as before the window is painted
    bar.setValue(bar.value() - 1)  # the user moves on: what they read now must stay
    height_before = card.height()
    reading = next(b for b in view.bubbles if _top(view, b) + b.height() > bar.value())
    offset_before = _top(view, reading) - bar.value()

    qtbot.waitUntil(lambda: card.complete, timeout=5000)
    qtbot.wait(50)

    assert card.height() > height_before
    assert _top(view, reading) - bar.value() == offset_before


def test_a_long_reply_still_streaming_gets_its_card_in_slices_and_goes_on_streaming(qtbot, chat_view):
    """What switching to a conversation that is answering does: its reply so far is long already."""
    view = chat_view
    reply = DisplayMessage("assistant", _long_reply(), state="streaming")
    view.show_messages((DisplayMessage("user", "Explain it all"), reply))
    card = view.bubble_for(reply)
    assert not card.complete and "The very last sentence." not in card.shown_text()
    reply.content += "\n\nOne more"
    card.refresh()

    qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    assert card.complete and card.shown_text().rstrip().endswith("One more")
    reply.content += " line, streamed after it grew."
    card.refresh()
    qtbot.waitUntil(lambda: card.shown_text().rstrip().endswith("streamed after it grew."), timeout=1000)
    assert "Point 7: keep case 7 in mind." in card.shown_text()
