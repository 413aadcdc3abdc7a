"""What an empty conversation shows: a greeting and a few prompts to start from (GUI thread)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

SUGGESTED_PROMPTS = (
    "Explain how language models work, simply",
    "Write a palindrome check in Python",
    "Three ideas for a quick vegetarian dinner",
    "Summarise the text I paste next",
)
TITLE_GROWTH_PT = 4
BUTTON_TEXT_MARGIN_PX = 16


class WelcomePane(QWidget):
    """A greeting and ``SUGGESTED_PROMPTS`` as buttons; ``prompt_chosen`` carries the one clicked."""

    prompt_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcomePane")
        self.setAccessibleName("New conversation")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # the style sheet paints its background
        column = QVBoxLayout(self)
        column.setAlignment(Qt.AlignmentFlag.AlignCenter)
        column.setContentsMargins(24, 24, 24, 24)
        title = QLabel("Start a conversation", objectName="welcomeTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        font = title.font()
        font.setPointSize(font.pointSize() + TITLE_GROWTH_PT)
        font.setBold(True)
        title.setFont(font)
        hint = QLabel("Write below, or start from one of these:", objectName="welcomeHint", wordWrap=True)
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        column.addWidget(title)
        column.addWidget(hint)
        self.buttons: list[QPushButton] = []
        for prompt in SUGGESTED_PROMPTS:
            button = QPushButton(prompt, self, objectName="suggestedPrompt")
            button.setToolTip(f"{prompt}\n(puts it into the message box; press Enter to send it)")
            button.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # a narrow window cuts, never widens
            button.clicked.connect(lambda _checked=False, text=prompt: self.prompt_chosen.emit(text))  # whole, if cut
            self.buttons.append(button)
            column.addWidget(button)

    def resizeEvent(self, event: QResizeEvent) -> None:
        """In a narrow window a prompt is cut with "…" at its end (whole in its tooltip)."""
        super().resizeEvent(event)
        for button, prompt in zip(self.buttons, SUGGESTED_PROMPTS):
            room = button.width() - BUTTON_TEXT_MARGIN_PX
            button.setText(button.fontMetrics().elidedText(prompt, Qt.TextElideMode.ElideRight, room))
