"""Conversation > Conversation settings…: this conversation's system prompt and sampling (GUI thread).

"Use the default sampling" stores no sampling of its own, so later changes to the defaults
apply; unticked, the values shown are kept with the conversation. Saving goes through the
journal (a new conversation is saved first); a failure is shown and the dialog stays open.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.conversations.conversation import Conversation
from app.conversations.persistence import ConversationJournal
from app.settings.sampling_form import SamplingForm
from app.settings.saving_dialog import SavingDialog
from app.storage import SamplingSettings


class ConversationSettingsDialog(SavingDialog):
    """Edits one conversation's system prompt and sampling."""

    def __init__(
        self, conversation: Conversation, journal: ConversationJournal, defaults: SamplingSettings, parent: QWidget | None = None
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
        self._lay_out()

    def accept(self) -> None:
        sampling = None if self.use_defaults.isChecked() else self.sampling.values()
        self.save_then_close(
            lambda: self._journal.set_conversation_settings(self._conversation, self.system_prompt.toPlainText(), sampling)
        )

    def _lay_out(self) -> None:
        layout = QVBoxLayout(self)
        prompt_label = QLabel("System &prompt", self)
        prompt_label.setBuddy(self.system_prompt)
        layout.addWidget(prompt_label)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.use_defaults)
        layout.addWidget(self.sampling)
        layout.addWidget(self.error_label)
        layout.addWidget(self.save_cancel_buttons())


def open_conversation_settings(window) -> ConversationSettingsDialog | None:
    """Open the settings of the conversation on screen (refused while a reply is written)."""
    if window.session.generating:
        window.status_line.show_notice("Stop the reply first, then change the conversation's settings.")
        return None
    dialog = ConversationSettingsDialog(
        window.session.conversation, window.journal, window.settings_holder.settings.sampling, window
    )
    dialog.accepted.connect(lambda: window.session.saved.emit(window.session.conversation.id))
    dialog.finished.connect(dialog.deleteLater)
    window.conversation_settings_dialog = dialog
    dialog.open()
    return dialog
