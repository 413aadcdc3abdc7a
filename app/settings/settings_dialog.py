"""Settings > Default settings…: the defaults new conversations start with, and the tool servers (GUI thread).

The General tab holds the system prompt, sampling and theme: conversations without their
own sampling follow these defaults; the system prompt is copied into each new
conversation. The Tools tab (``app.tools.tools_page``) lists the MCP tool servers.
Saving writes the settings file at once; if that fails the dialog says why and stays
open, so nothing typed is lost.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QPlainTextEdit, QTabWidget, QVBoxLayout, QWidget

from app.settings.app_settings import SettingsHolder
from app.settings.appearance import THEME_LABELS
from app.settings.sampling_form import SamplingForm
from app.settings.saving_dialog import SavingDialog
from app.tools.tools_page import ToolsPage


class SettingsDialog(SavingDialog):
    """Edits the global defaults held by a ``SettingsHolder``."""

    def __init__(self, holder: SettingsHolder, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
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
        self.tools_page = ToolsPage(settings.tool_servers, self)
        self.tabs = QTabWidget(self)
        self.tabs.setAccessibleName("Settings pages")
        self.tabs.tabBar().setAccessibleName("Settings pages")
        self.error_label.setObjectName("settingsError")
        self._lay_out()

    def accept(self) -> None:
        """Save; on failure show why and stay open."""
        settings = replace(
            self._holder.settings,
            system_prompt=self.system_prompt.toPlainText(),
            theme=self.theme_box.currentData(),
            sampling=self.sampling.values(),
            tool_servers=self.tools_page.servers(),
        )
        self.save_then_close(lambda: self._holder.replace(settings))

    def show_tools(self) -> None:
        """Show the Tools tab (Settings › Tools…)."""
        self.tabs.setCurrentWidget(self.tools_page)

    def _lay_out(self) -> None:
        general = QWidget(self.tabs)
        form = QFormLayout()
        form.addRow("System &prompt for new conversations", self.system_prompt)
        form.addRow("T&heme", self.theme_box)
        general_layout = QVBoxLayout(general)
        general_layout.addLayout(form)
        general_layout.addWidget(QLabel("Sampling for conversations that have no settings of their own:", general))
        general_layout.addWidget(self.sampling)
        self.tabs.addTab(general, "&General")
        self.tabs.addTab(self.tools_page, "T&ools")
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(self.error_label)
        layout.addWidget(self.save_cancel_buttons())


def open_settings_dialog(window) -> SettingsDialog:
    """Open the dialog without blocking the window; it deletes itself when closed."""
    dialog = SettingsDialog(window.settings_holder, window)
    dialog.finished.connect(dialog.deleteLater)
    window.settings_dialog = dialog
    dialog.open()
    return dialog
