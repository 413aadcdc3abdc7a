"""Long replies and long conversations stay cheap: only new text is rendered, only nearby cards are made."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtGui import QTextDocument

from app.chat import reply_view
from app.chat.chat_view import ChatView
from app.chat.code_blocks import LIGHT_CODE
from app.chat.markdown_render import markdown_to_html
from app.chat.reply_view import ReplyView
from app.conversations.conversation import DisplayMessage


def test_a_growing_reply_renders_only_its_new_chunks_and_reads_like_a_full_render(qtbot, monkeypatch):
    rendered: list[str] = []
    real_chunk_html = reply_view.chunk_html
    monkeypatch.setattr(reply_view, "chunk_html", lambda chunk, colours: rendered.append(chunk.source) or real_chunk_html(chunk, colours))
    view = ReplyView()
    qtbot.addWidget(view)
    text = "First **paragraph**.\n\n```python\nx = 1\n"
    view.show_markdown(text, LIGHT_CODE)
    rendered.clear()

    text += "y = 2\n```\n\n- one\n- two\n\nLast words"
    view.show_markdown(text, LIGHT_CODE)

    assert not any("First" in source for source in rendered)
    assert rendered[0].startswith("```python") and "y = 2" in rendered[0]
    full = QTextDocument()
    full.setHtml(markdown_to_html(text))
    assert view.toPlainText().split() == full.toPlainText().split()


def _long_view(qtbot, count: int) -> tuple[ChatView, tuple[DisplayMessage, ...]]:
    view = ChatView()
    view.resize(600, 400)
    qtbot.addWidget(view)
    view.show()
    messages = tuple(DisplayMessage("user" if i % 2 == 0 else "assistant", f"Message {i}\n\nsome text") for i in range(count))
    view.show_messages(messages)
    qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    return view, messages


def test_a_long_conversation_opens_at_its_end_with_few_cards(qtbot):
    view, messages = _long_view(qtbot, 300)
    bar = view.verticalScrollBar()

    assert view.bubbles[-1].message is messages[-1]
    assert len(view.bubbles) < 100
    assert bar.value() == bar.maximum()


def test_scrolling_up_reaches_the_first_message_and_the_text_read_stays_in_place(qtbot):
    view, messages = _long_view(qtbot, 300)
    bar = view.verticalScrollBar()
    bar.setValue(0)
    reading = view.bubbles[0]
    top_before = reading.mapTo(view.viewport(), QPoint(0, 0)).y()
    qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    qtbot.wait(50)

    assert reading.mapTo(view.viewport(), QPoint(0, 0)).y() == top_before
    for _ in range(200):
        if view.bubbles[0].message is messages[0]:
            break
        bar.setValue(0)
        qtbot.waitUntil(lambda: not view.loading, timeout=5000)
    assert [bubble.message for bubble in view.bubbles] == list(messages)
