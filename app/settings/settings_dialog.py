"""Settings > Default settings…: the system prompt, sampling and theme new conversations start with (GUI thread).

Conversations without their own sampling follow these defaults; the system prompt is copied
into each new conversation. Saving writes the settings file at once; if that fails the
dialog says why and stays open, so nothing typed is lost.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.settings.app_settings import SettingsHolder
from app.settings.appearance import THEME_LABELS
from app.settings.sampling_form import SamplingForm
from app.settings.saving_dialog import SavingDialog


class SettingsDialog(SavingDialog):
    """Edits the global defaults held by a ``SettingsHolder``."""

    def __init__(self, holder: SettingsHolder, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Default settings")
        self.setAccessibleName("Default settings")
        self._holder = holder
        settings = holder.settings
        self.system_prompt = QPlainTextEdit(settings.system_prompt, self)
        self.system_prompt.setAccessibleName("Default system prompt")
        self.system_prompt.setTabChangesFocus(True)
        self.theme_box = QComboBox(self)
        self.theme_box.setAccessibleName("Theme")
        for theme, label in THEME_LABELS.items():
            self.theme_box.addItem(label, theme)
        self.theme_box.setCurrentIndex(self.theme_box.findData(settings.theme))
        self.sampling = SamplingForm(self)
        self.sampling.set_values(settings.sampling)
        self.error_label.setObjectName("settingsError")
        self._lay_out()

    def accept(self) -> None:
        """Save; on failure show why and stay open."""
        settings = replace(
            self._holder.settings,
            system_prompt=self.system_prompt.toPlainText(),
            theme=self.theme_box.currentData(),
            sampling=self.sampling.values(),
        )
        self.save_then_close(lambda: self._holder.replace(settings))

    def _lay_out(self) -> None:
        form = QFormLayout()
        form.addRow("System &prompt for new conversations", self.system_prompt)
        form.addRow("T&heme", self.theme_box)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(QLabel("Sampling for conversations that have no settings of their own:", self))
        layout.addWidget(self.sampling)
        layout.addWidget(self.error_label)
        layout.addWidget(self.save_cancel_buttons())


def open_settings_dialog(window) -> SettingsDialog:
    """Open the dialog without blocking the window; it deletes itself when closed."""
    dialog = SettingsDialog(window.settings_holder, window)
    dialog.finished.connect(dialog.deleteLater)
    window.settings_dialog = dialog
    dialog.open()
    return dialog
