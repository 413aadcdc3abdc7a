"""What a user sees: cards told apart by side and colour, every control named for screen readers.

Set HEARTH_SCREENSHOT to a file path to keep the screenshot this test takes.
"""

from __future__ import annotations

import os

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QAbstractButton, QLabel, QPlainTextEdit, QWidget


def _have_a_short_exchange(chat, script) -> None:
    script.reply_tokens = (
        "A **hearth** is the floor of a fireplace.\n\n",
        "In code:\n\n```python\nfire = Hearth()\nfire.light()\n```\n\n",
        "- warm\n- bright\n\n",
        "It is where a household gathers: people cook there, dry their boots and tell long stories "
        "late into the evening, which is why the word also stands for home itself.",
    )
    chat.wait_until_ready()
    chat.window.resize(760, 560)
    chat.type_and_press_enter("What is a hearth?")
    chat.wait_until_reply_ends()
    chat.qtbot.wait(100)


def test_user_and_assistant_cards_differ_in_side_and_colour(chat, script, tmp_path):
    _have_a_short_exchange(chat, script)
    view = chat.window.chat_view
    user_card, assistant_card = view.bubbles
    screenshot = chat.window.grab()
    screenshot.save(os.environ.get("HEARTH_SCREENSHOT") or str(tmp_path / "window.png"))

    def left_edge(card: QWidget) -> int:
        return card.mapTo(view.widget(), QPoint(0, 0)).x()

    def colour_inside(card: QWidget) -> str:
        corner = card.mapTo(chat.window, QPoint(6, card.height() - 4))
        return screenshot.toImage().pixelColor(corner).name()

    assert left_edge(user_card) + user_card.width() > view.viewport().width() - 40
    assert left_edge(assistant_card) < 40
    assert left_edge(user_card) > left_edge(assistant_card)
    assert colour_inside(user_card) != colour_inside(assistant_card)
    assert user_card.title.text() == "You"
    assert assistant_card.title.text() == "Assistant"


def test_every_control_has_an_accessible_name(chat, script):
    _have_a_short_exchange(chat, script)
    controls = [
        widget
        for widget in chat.window.findChildren(QWidget)
        if isinstance(widget, (QAbstractButton, QPlainTextEdit, QLabel)) and widget.isVisible()
    ]

    assert len(controls) >= 6
    assert [widget for widget in controls if not widget.accessibleName()] == []
