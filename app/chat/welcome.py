"""What an empty conversation shows: a greeting and a few prompts to start from (GUI thread)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

SUGGESTED_PROMPTS = (
    "Explain how a transformer language model works, in simple words.",
    "Write a Python function that checks whether a word is a palindrome.",
    "Give me three ideas for a quick vegetarian dinner.",
    "Summarise the main points of a text I will paste next.",
)


class WelcomePane(QWidget):
    """A greeting and ``SUGGESTED_PROMPTS`` as buttons; ``prompt_chosen`` carries the one clicked."""

    prompt_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcomePane")
        self.setAccessibleName("New conversation")
        column = QVBoxLayout(self)
        column.setAlignment(Qt.AlignmentFlag.AlignCenter)
        column.setContentsMargins(24, 24, 24, 24)
        title = QLabel("Start a conversation", objectName="welcomeTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint = QLabel("Write below, or start from one of these:", objectName="welcomeHint", wordWrap=True)
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        column.addWidget(title)
        column.addWidget(hint)
        self.buttons: list[QPushButton] = []
        for prompt in SUGGESTED_PROMPTS:
            button = QPushButton(prompt, self, objectName="suggestedPrompt")
            button.setToolTip("Puts this into the message box; press Enter to send it")
            button.clicked.connect(lambda _checked=False, text=prompt: self.prompt_chosen.emit(text))
            self.buttons.append(button)
            column.addWidget(button)
