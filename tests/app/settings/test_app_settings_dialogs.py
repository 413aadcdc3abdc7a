"""Settings: global defaults in a dialog, per-conversation settings, a damaged file, light and dark."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QApplication, QMessageBox, QWidget

from app.conversations.conversation_settings import open_conversation_settings
from app.settings.settings_dialog import open_settings_dialog
from app.storage import load_settings
from app.storage.settings import default_settings_path
from engine.protocol.messages import ChatMessage


def test_default_settings_are_saved_and_used_by_new_conversations(chat, script):
    dialog = open_settings_dialog(chat.window)
    dialog.system_prompt.setPlainText("Be kind.")
    dialog.sampling.box("temperature").setValue(0.3)
    dialog.sampling.box("seed").setValue(7)
    dialog.sampling.drafts_box.setChecked(False)
    dialog.accept()
    chat.qtbot.keyClick(chat.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat.send_and_wait("Hello")

    saved = load_settings().settings
    assert (saved.system_prompt, saved.sampling.temperature, saved.sampling.seed) == ("Be kind.", 0.3, 7)
    assert not saved.sampling.speculative
    request = script.generates[-1]
    assert request.messages[0] == ChatMessage("system", "Be kind.")
    assert (request.sampling.temperature, request.sampling.seed, request.sampling.speculative) == (0.3, 7, False)


def test_a_conversation_keeps_its_own_sampling_and_system_prompt(chat, script, reopen):
    chat.send_and_wait("Hello")
    dialog = open_conversation_settings(chat.window)
    dialog.system_prompt.setPlainText("Talk like a pirate.")
    dialog.use_defaults.setChecked(False)
    dialog.sampling.box("top_k").setValue(5)
    dialog.sampling.box("max_new_tokens").setValue(64)
    dialog.accept()
    chat.send_and_wait("Again")

    request = script.generates[-1]
    assert request.messages[0] == ChatMessage("system", "Talk like a pirate.")
    assert (request.sampling.top_k, request.sampling.max_new_tokens) == (5, 64)
    again = reopen().session.conversation
    assert again.system_prompt == "Talk like a pirate." and again.sampling.top_k == 5


def test_a_damaged_settings_file_falls_back_to_defaults_with_a_notice(hearth_home, reopen):
    default_settings_path().write_text("{ not json", encoding="utf-8")

    window = reopen()

    notice = window.findChild(QMessageBox, "startupNotice")
    assert notice is not None and "could not be read" in notice.text()
    assert window.settings_holder.settings.theme == "system"


def test_the_dark_theme_can_be_chosen_and_is_remembered(chat, reopen):
    dark = next(a for a in chat.window.theme_switcher.group.actions() if a.data() == "dark")
    dark.trigger()

    assert QApplication.palette().window().color().lightness() < 128
    assert load_settings().settings.theme == "dark"
    light = next(a for a in reopen().theme_switcher.group.actions() if a.data() == "light")
    assert next(a for a in chat.window.theme_switcher.group.actions() if a.data() == "dark").isChecked()
    light.trigger()
    assert QApplication.palette().window().color().lightness() >= 128


def _spoken_name(widget: QWidget) -> str:
    """What a screen reader says: the accessible name, a button's text, or the spin box around an editor."""
    if widget.accessibleName():
        return widget.accessibleName()
    if isinstance(widget, QAbstractButton):
        return widget.text().replace("&", "")
    parent = widget.parentWidget()
    return parent.accessibleName() if isinstance(parent, QAbstractSpinBox) else ""


def test_every_control_of_the_window_and_dialogs_has_an_accessible_name(chat):
    chat.send_and_wait("Hello")
    dialogs = [open_settings_dialog(chat.window), open_conversation_settings(chat.window)]
    unnamed = [
        f"{widget.metaObject().className()} {widget.objectName()!r}"
        for root in [chat.window, *dialogs]
        for widget in root.findChildren(QWidget)
        if widget.focusPolicy() & Qt.FocusPolicy.TabFocus and widget.isVisibleTo(root) and not _spoken_name(widget)
    ]
    assert unnamed == []
