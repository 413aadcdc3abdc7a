"""How messages look: Markdown, escaped HTML, coalesced re-rendering, following the bottom."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.chat import message_bubble
from app.chat.chat_view import ChatView
from app.chat.markdown_render import markdown_to_html
from app.chat.reply_view import ReplyView
from app.conversations.conversation import DisplayMessage


def test_code_blocks_are_monospaced_even_while_the_fence_is_still_open():
    html = markdown_to_html("Look:\n\n```python\nprint('hi')")

    assert "<pre style=\"font-family: 'DejaVu Sans Mono'" in html
    assert "print" in html and "'hi'" in html


def test_html_written_by_the_model_is_shown_as_text():
    html = markdown_to_html('Hi <img src="file:///etc/passwd"> <b>bold?</b>')

    assert "<img" not in html
    assert "&lt;b&gt;bold?&lt;/b&gt;" in html


def test_a_streaming_reply_is_rendered_at_most_once_per_interval(qtbot, monkeypatch):
    renders: list[str] = []
    monkeypatch.setattr(ReplyView, "show_markdown", lambda _view, text, _colours, _most_new_chunks=None: renders.append(text) or True)
    message = DisplayMessage("assistant", "", state="streaming")
    bubble = message_bubble.MessageBubble(message)
    qtbot.addWidget(bubble)
    renders.clear()

    for index in range(200):
        message.content += f"t{index} "
        bubble.refresh()
    assert renders == []
    qtbot.waitUntil(lambda: bool(renders), timeout=1000)

    assert len(renders) == 1
    assert renders[0].endswith("t199 ")
    message.state = "done"
    bubble.refresh()
    assert len(renders) == 2


def _long_view(qtbot) -> tuple[ChatView, DisplayMessage]:
    view = ChatView()
    view.resize(500, 300)
    qtbot.addWidget(view)
    view.show()
    for index in range(6):
        view.add_message(DisplayMessage("user", f"question {index}\n" * 4))
    reply = DisplayMessage("assistant", "", state="streaming")
    view.add_message(reply)
    return view, reply


def _stream_lines(view: ChatView, reply: DisplayMessage, count: int) -> None:
    reply.content += "another line\n\n" * count
    view.bubbles[-1].refresh()


def test_the_view_follows_a_streaming_reply(qtbot):
    view, reply = _long_view(qtbot)
    _stream_lines(view, reply, 30)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=2000)


def test_the_view_stays_put_when_the_user_scrolled_up(qtbot):
    view, reply = _long_view(qtbot)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0, timeout=2000)
    bar.setValue(0)
    _stream_lines(view, reply, 30)
    qtbot.wait(120)
    QApplication.processEvents()

    assert bar.value() == 0
    assert not view.following_bottom


def test_a_long_code_line_wraps_in_a_narrow_window_instead_of_being_cut(qtbot, chat_view):
    from app.conversations.conversation import DisplayMessage

    chat_view.resize(400, 400)
    line = "result = some_function(first_argument, second_argument, third_argument, fourth_argument)"
    chat_view.show_messages((DisplayMessage("assistant", f"```python\n{line}\n```"),))
    body = chat_view.bubbles[-1].body
    qtbot.waitUntil(lambda: body.viewport().width() < 400)

    assert body.document().size().width() <= body.viewport().width()
    assert line in body.toPlainText()


def test_in_a_narrow_view_a_stopped_reply_note_sits_below_its_last_line(qtbot, chat_view):
    from app.conversations.conversation import DisplayMessage

    chat_view.resize(620, 500)
    replies = [DisplayMessage("assistant", "Once upon a time, in the sleepy town of Rav", state="interrupted")
               for _ in range(5)]
    chat_view.show_messages(tuple(message for reply in replies for message in (DisplayMessage("user", "Go on"), reply)))
    qtbot.wait(100)
    chat_view.resize(230, 500)  # the performance panel opened beside a 900 px window
    qtbot.wait(200)

    cards = [card for card in chat_view.bubbles if card.message.role == "assistant"]
    assert cards and all(card.note.isVisible() for card in cards)
    for card in cards:
        assert card.note.geometry().top() >= card.body.geometry().bottom(), "the note never covers the text"
