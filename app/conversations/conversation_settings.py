"""Conversation > Conversation settings…: this conversation's system prompt, sampling, reply format and tools
(GUI thread).

"Use the default sampling" stores no sampling of its own, so later changes to the defaults
apply; unticked, the values shown are kept with the conversation. The reply format makes
the engine answer in free text, any JSON object, or JSON of a pasted schema; a schema
that cannot be used is named under the fields and nothing is saved. "Use tools" offers
the model the tools of Settings › Tools (each call asks first); it needs free-text replies,
since a JSON reply cannot hold a call, and a tool hub (without one it is shown but cannot be
ticked). Saving goes through the journal (a new conversation is saved first); a failure is
shown and the dialog stays open.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.conversations.conversation import Conversation
from app.conversations.reply_format import REPLY_KINDS, ReplyFormat
from app.conversations.persistence import ConversationJournal
from app.settings.sampling_form import SamplingForm
from app.settings.saving_dialog import SavingDialog
from app.storage import SamplingSettings


TOOLS_NEED_FREE_TEXT = (
    "Tools need free-text replies (a JSON reply cannot call a tool): choose Free text, or untick Use tools."
)


class ConversationSettingsDialog(SavingDialog):
    """Edits one conversation's system prompt, sampling and reply format."""

    def __init__(
        self, conversation: Conversation, journal: ConversationJournal, defaults: SamplingSettings,
        tools_available: bool = False, parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("conversationSettingsDialog")
        self.setWindowTitle("Conversation settings")
        self.setAccessibleName("Conversation settings")
        self._conversation = conversation
        self._journal = journal
        self.system_prompt = QPlainTextEdit(conversation.system_prompt, self)
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setTabChangesFocus(True)
        self.use_defaults = QCheckBox("Use the &default sampling", self)
        self.use_defaults.setAccessibleName("Use the default sampling")
        self.use_defaults.setChecked(conversation.sampling is None)
        self.sampling = SamplingForm(self)
        self.sampling.set_values(conversation.sampling or defaults)
        self.sampling.setEnabled(conversation.sampling is not None)
        self.use_defaults.toggled.connect(lambda checked: self.sampling.setEnabled(not checked))
        self.reply_kind = QComboBox(self)
        self.reply_kind.setAccessibleName("Reply format")
        for kind, label in REPLY_KINDS.items():
            self.reply_kind.addItem(label, kind)
        self.reply_kind.setCurrentIndex(list(REPLY_KINDS).index(conversation.reply_format.kind))
        self.schema = QPlainTextEdit(conversation.reply_format.schema, self)
        self.schema.setAccessibleName("JSON schema")
        self.schema.setPlaceholderText('{"type": "object", "properties": {"answer": {"type": "string"}}}')
        self.schema.setTabChangesFocus(True)
        self.reply_kind.currentIndexChanged.connect(self._show_schema)
        self.use_tools = QCheckBox("Use &tools", self)
        self.use_tools.setAccessibleName("Use tools")
        self.use_tools.setChecked(conversation.use_tools)
        self.use_tools.setEnabled(tools_available or conversation.use_tools)
        self.use_tools.setToolTip(
            "The model may call the tools of Settings › Tools; each call asks you first unless you always allow it."
            if tools_available else "No tool servers are set up: add one in Settings › Tools."
        )
        self._show_schema()
        self._lay_out()

    def reply_format(self) -> ReplyFormat:
        """The reply format as the fields stand."""
        return ReplyFormat(self.reply_kind.currentData(), self.schema.toPlainText())

    def accept(self) -> None:
        sampling = None if self.use_defaults.isChecked() else self.sampling.values()
        reply_format = self.reply_format()
        problem = reply_format.schema_problem()
        if self.use_tools.isChecked() and reply_format.kind != "text":
            problem = TOOLS_NEED_FREE_TEXT
        if problem:
            self.error_label.setText(problem)
            self.error_label.show()
            return
        self.save_then_close(
            lambda: self._journal.set_conversation_settings(
                self._conversation, self.system_prompt.toPlainText(), sampling, reply_format, self.use_tools.isChecked()
            )
        )

    def _show_schema(self) -> None:
        self.schema.setVisible(self.reply_kind.currentData() == "json_schema")

    def _lay_out(self) -> None:
        layout = QVBoxLayout(self)
        prompt_label = QLabel("System &prompt", self)
        prompt_label.setBuddy(self.system_prompt)
        layout.addWidget(prompt_label)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.use_defaults)
        layout.addWidget(self.sampling)
        format_label = QLabel("&Reply format", self)
        format_label.setBuddy(self.reply_kind)
        layout.addWidget(format_label)
        layout.addWidget(self.reply_kind)
        layout.addWidget(self.schema)
        layout.addWidget(self.use_tools)
        layout.addWidget(self.error_label)
        layout.addWidget(self.save_cancel_buttons())


def _tool_servers_on(window) -> bool:
    """Whether the window has a tool hub and Settings › Tools has a server turned on."""
    servers = window.settings_holder.settings.tool_servers
    return window.session.replies.tool_hub is not None and any(server.enabled for server in servers)


def open_conversation_settings(window) -> ConversationSettingsDialog | None:
    """Open the settings of the conversation on screen (refused while a reply is written)."""
    if window.session.generating:
        window.status_line.show_notice("Stop the reply first, then change the conversation's settings.")
        return None
    dialog = ConversationSettingsDialog(
        window.session.conversation, window.journal, window.settings_holder.settings.sampling,
        _tool_servers_on(window), window,
    )
    dialog.accepted.connect(lambda: window.session.saved.emit(window.session.conversation.id))
    dialog.finished.connect(dialog.deleteLater)
    window.conversation_settings_dialog = dialog
    dialog.open()
    return dialog
