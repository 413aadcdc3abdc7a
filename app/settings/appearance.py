"""Light and dark: follow the system, or the user's choice in View > Theme (GUI thread).

The window's colours come from a style sheet per theme (``theme.STYLE_SHEET`` for light) and a
matching application palette, so dialogs and menus agree with the cards. With "Follow the
system" the theme changes when the system's colour scheme does.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QActionGroup, QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QMainWindow, QMenu

from app.settings.app_settings import SettingsHolder
from app.settings.theme import STYLE_SHEET
from app.storage import Settings, StorageError

THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}

DARK_STYLE_SHEET = """
#chatView, #chatContainer, #welcomePane { background: #1f1d1b; border: none; }
#welcomePane QLabel { color: #ece8e3; }
#userBubble { background: #5a3d24; border: 1px solid #6e4c2e; border-radius: 10px; }
#assistantBubble { background: #2b2927; border: 1px solid #3a3734; border-radius: 10px; }
#bubbleTitle { color: #e0b48a; font-weight: bold; font-size: 11px; background: transparent; border: none; }
#assistantBubble #bubbleTitle { color: #b8c0ca; }
#bubbleBody { color: #ece8e3; background: transparent; border: none; }
#bubbleNote { color: #b0a69b; font-style: italic; font-size: 11px; background: transparent; border: none; }
#bubbleNote[state="error"] { color: #ff8a80; font-style: normal; }
#inputBar { background: #262422; border-top: 1px solid #3a3734; }
#prompt { background: #2f2c2a; color: #ece8e3; border: 1px solid #4a4541; border-radius: 8px; padding: 4px; }
#prompt:focus { border: 1px solid #d08a4a; }
#damageBanner { background: #4a1f1c; color: #ffb4ab; border: 1px solid #8c1d18; border-radius: 6px; padding: 6px; }
#sendButton, #stopButton { min-width: 72px; padding: 6px 12px; }
"""

_DARK_COLOURS = {
    QPalette.ColorRole.Window: "#262422",
    QPalette.ColorRole.WindowText: "#ece8e3",
    QPalette.ColorRole.Base: "#2f2c2a",
    QPalette.ColorRole.AlternateBase: "#34312e",
    QPalette.ColorRole.Text: "#ece8e3",
    QPalette.ColorRole.Button: "#34312e",
    QPalette.ColorRole.ButtonText: "#ece8e3",
    QPalette.ColorRole.Highlight: "#b5652b",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#34312e",
    QPalette.ColorRole.ToolTipText: "#ece8e3",
    QPalette.ColorRole.PlaceholderText: "#8f877f",
    QPalette.ColorRole.Link: "#f0a868",
}


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def wants_dark(theme: str) -> bool:
    return theme == "dark" or (theme == "system" and system_is_dark())


_DARK_DISABLED_TEXT = "#7a736c"


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in _DARK_COLOURS.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DARK_DISABLED_TEXT))
    return palette


def apply_theme(window: QMainWindow, theme: str) -> None:
    """Colour the application and ``window`` for ``theme`` and re-render the cards' code blocks."""
    dark = wants_dark(theme)
    app = QApplication.instance()
    app.setPalette(dark_palette() if dark else app.style().standardPalette())
    window.setStyleSheet(DARK_STYLE_SHEET if dark else STYLE_SHEET)
    for bubble in window.chat_view.bubbles:
        bubble.refresh()


class ThemeSwitcher(QObject):
    """View > Theme with the three choices; applies the current one and follows changes to it or the system."""

    def __init__(self, window: QMainWindow, holder: SettingsHolder, menu: QMenu) -> None:
        super().__init__(window)
        self._window = window
        self._holder = holder
        theme_menu = menu.addMenu("&Theme")
        self.group = QActionGroup(theme_menu)
        for theme, label in THEME_LABELS.items():
            action = QAction(label, theme_menu, checkable=True)
            action.setData(theme)
            self.group.addAction(action)
            theme_menu.addAction(action)
        self.group.triggered.connect(self._choose)
        holder.changed.connect(self._follow_settings)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._follow_system)
        self._follow_settings(holder.settings)

    def _choose(self, action: QAction) -> None:
        try:
            self._holder.update(theme=action.data())
        except StorageError as error:
            self._window.status_line.show_notice(f"{error} The theme is used for this session only.")
            apply_theme(self._window, action.data())

    def _follow_settings(self, settings: Settings) -> None:
        for action in self.group.actions():
            action.setChecked(action.data() == settings.theme)
        apply_theme(self._window, settings.theme)

    def _follow_system(self, _scheme: Qt.ColorScheme) -> None:
        if self._holder.settings.theme == "system":
            apply_theme(self._window, "system")
