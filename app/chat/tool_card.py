"""A tool call as a card in the chat: the tool, its arguments, how it stands, its result (GUI thread).

The card shows a "tool" ``DisplayMessage``: the tool's name (and its server), the call's status
and the time it took, the arguments pretty-printed, and the result the model reads (its
first ``RESULT_PREVIEW_CHARS`` characters; Copy copies all of it). While the call waits for the
user, the card asks: Allow once, Always allow or Deny (side by side, or one above the other in
a narrow card), announced through ``action_requested`` as ``tool_round.TOOL_ANSWERS``. It
answers the chat view as a ``MessageBubble`` does (``refresh``, ``grow``, ``shown_text``), so
the view lays both out alike.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QResizeEvent
from PySide6.QtWidgets import (
    QBoxLayout, QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QToolButton, QVBoxLayout, QWidget,
)

from app.chat.message_bubble import COPIED_MS
from app.chat.tool_round import ToolAnswer
from app.conversations.conversation import DisplayMessage
from app.storage.export import pretty_json
from app.storage.records import ToolStatus

RESULT_PREVIEW_CHARS = 2000
STATUS_TEXTS: dict[ToolStatus, str] = {
    "waiting": "Waiting for your approval",
    "running": "Running…",
    "done": "Done",
    "error": "Error",
    "timeout": "Timed out",
    "denied": "Denied",
    "stopped": "Stopped",
    "skipped": "Not run",
}
_ANSWER_BUTTONS: tuple[tuple[ToolAnswer, str, str], ...] = (
    ("allow_once", "&Allow once", "Run this call once"),
    ("allow_always", "Al&ways allow", "Run this tool from now on without asking"),
    ("deny", "&Deny", "Do not run it; the model is told you denied it"),
)


def _time_taken(seconds: float) -> str:
    """How long the call took, for the status line ("" when it did not run)."""
    if seconds <= 0:
        return ""
    return "  ·  under 0.01 s" if seconds < 0.01 else f"  ·  {seconds:.2f} s"


def result_preview(text: str) -> str:
    """The result as the card shows it: at most ``RESULT_PREVIEW_CHARS`` characters, and how many more there are."""
    if len(text) <= RESULT_PREVIEW_CHARS:
        return text
    return f"{text[:RESULT_PREVIEW_CHARS]}…\n({len(text) - RESULT_PREVIEW_CHARS:,} more characters: Copy copies all)"


class ToolCard(QFrame):
    """Shows a "tool" ``DisplayMessage``; call ``refresh`` after its call moved on."""

    action_requested = Signal(str)
    """The user's answer while the call waits: one of ``tool_round.TOOL_ANSWERS``."""

    def __init__(self, message: DisplayMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        assert message.tool is not None
        self.message = message
        self.setObjectName("toolCard")
        self.setAccessibleName(f"Tool call {message.tool.function_name}")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.title = self._label("toolTitle", "Tool")
        self.status = self._label("toolStatus", "Tool call status")
        self.copy_button = QToolButton(self)
        self.copy_button.setText("Copy")
        self.copy_button.setObjectName("bubbleButton")
        self.copy_button.setAccessibleName("Copy the result")
        self.copy_button.setToolTip("Copy the result")
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy_result)
        self.arguments = self._label("toolArguments", "Arguments", selectable=True)
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.result_caption = self._label("toolCaption", "Result caption")
        self.result_caption.setText("Result")
        self.result = self._label("toolResult", "Result", selectable=True)
        self.question = self._label("toolQuestion", "Approval")
        self.answer_buttons = [self._answer_button(*spec) for spec in _ANSWER_BUTTONS]
        self._buttons = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        self._lay_out()
        self.refresh()

    @property
    def complete(self) -> bool:
        """Always True: a tool card is made whole at once."""
        return True

    def grow(self, _deadline: float) -> bool:
        return True

    def shown_text(self) -> str:
        """The card's text: title, status, arguments and result."""
        parts = (self.title.text(), self.status.text(), self.arguments.text(), self.result.text())
        return "\n".join(part for part in parts if part)

    def copy_result(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)
        self.copy_button.setText("Copied")
        button = self.copy_button
        QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))  # skipped if the card is gone

    def refresh(self) -> None:
        """Show the call as it stands now."""
        tool = self.message.tool
        assert tool is not None
        server = f"  ·  {tool.server}" if tool.server else ""
        self.title.setText(f"Tool: {tool.function_name}{server}")
        self.status.setText(STATUS_TEXTS[tool.status] + _time_taken(tool.seconds))
        if self.status.property("status") != tool.status:
            self.status.setProperty("status", tool.status)
            self.status.style().polish(self.status)
        self.arguments.setText(pretty_json(tool.arguments))
        self.result.setText(result_preview(self.message.content))
        for widget in (self.result_caption, self.result):
            widget.setVisible(bool(self.message.content))
        waiting = tool.status == "waiting"
        self.question.setText(f"Let {tool.function_name} run with these arguments?" if waiting else "")
        for widget in (self.question, *self.answer_buttons):
            widget.setVisible(waiting)
        self.copy_button.setVisible(bool(self.message.content))
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        """As wide as the card may be (the chat view sets that), as tall as that makes it."""
        width = max(self.maximumWidth(), super().minimumSizeHint().width())
        return QSize(width, self.heightForWidth(width))

    def _lay_out(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 10)
        layout.setSpacing(4)
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.copy_button)
        layout.addLayout(header)
        layout.addWidget(self.status)
        layout.addWidget(self.arguments)
        layout.addWidget(self.result_caption)
        layout.addWidget(self.result)
        layout.addWidget(self.question)
        for button in self.answer_buttons:
            self._buttons.addWidget(button)
        self._buttons.addStretch(1)
        layout.addLayout(self._buttons)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_answer_buttons()

    def _fit_answer_buttons(self) -> None:
        """The answer buttons side by side when the card is wide enough for them, else one above the other."""
        margins = self.layout().contentsMargins()
        spacing = self._buttons.spacing() * (len(self.answer_buttons) - 1)
        needed = sum(button.sizeHint().width() for button in self.answer_buttons) + spacing
        fits = self.width() - margins.left() - margins.right() >= needed
        direction = QBoxLayout.Direction.LeftToRight if fits else QBoxLayout.Direction.TopToBottom
        if self._buttons.direction() != direction:
            self._buttons.setDirection(direction)

    def _answer_button(self, answer: ToolAnswer, text: str, tip: str) -> QPushButton:
        button = QPushButton(text, self)
        button.setObjectName(f"tool_{answer}")
        button.setAccessibleName(text.replace("&", ""))
        button.setToolTip(tip)
        button.clicked.connect(lambda: self.action_requested.emit(answer))
        return button

    def _label(self, object_name: str, accessible_name: str, selectable: bool = False) -> QLabel:
        label = QLabel("", self)
        label.setTextFormat(Qt.TextFormat.PlainText)
        label.setObjectName(object_name)
        label.setWordWrap(True)
        label.setAccessibleName(accessible_name)
        if selectable:
            flags = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard
            label.setTextInteractionFlags(flags)
        return label
