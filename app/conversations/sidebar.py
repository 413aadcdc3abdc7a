"""The conversation list beside the chat: search, new, rename, delete and undo (GUI thread).

The sidebar only shows and asks: it lists ``ConversationSummary`` rows newest first and
emits what the user wants (``chosen``, ``rename_requested``...). ``ConversationManager``
does the work. A conversation that is answering carries a dot before its title (and says
so in its tooltip and to screen readers). Each tooltip says when the conversation was
last used, which tells apart conversations of the same title. While the pointer is over
the list, a new order of the same conversations (a Send or Stop moves one to the top)
waits until it leaves, so no row moves under the pointer. Keyboard: Enter opens, F2
renames in place, Delete deletes, and the list, search box and buttons are reachable with Tab.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QKeyEvent, QPainter, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.storage import ConversationSummary

ID_ROLE = Qt.ItemDataRole.UserRole
ANSWERING_ROLE = Qt.ItemDataRole.UserRole + 1
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 2
ANSWERING_COLOUR = QColor("#c47a3a")
ANSWERING_DOT_PX = 10


def answering_icon() -> QIcon:
    """A small filled dot: the mark of a conversation whose reply is being written."""
    pixmap = QPixmap(ANSWERING_DOT_PX, ANSWERING_DOT_PX)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(ANSWERING_COLOUR)
    painter.drawEllipse(1, 1, ANSWERING_DOT_PX - 2, ANSWERING_DOT_PX - 2)
    painter.end()
    return QIcon(pixmap)


class Sidebar(QWidget):
    """Search box, New button, the list of conversations, and an Undo bar after a deletion."""

    chosen = Signal(str)
    new_requested = Signal()
    rename_requested = Signal(str, str)
    """Conversation id and the title typed in place."""
    delete_requested = Signal(str)
    undo_requested = Signal()
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.search_box = QLineEdit(self)
        self.search_box.setObjectName("searchBox")
        self.search_box.setPlaceholderText("Search conversations")
        self.search_box.setAccessibleName("Search conversations")
        self.search_box.setClearButtonEnabled(True)
        self.new_button = self._button("New", "New conversation", self.new_requested.emit)
        self._waiting: tuple[list[ConversationSummary], str | None] | None = None
        """A new order of the listed conversations, shown once the pointer leaves the list."""
        self.list = self._build_list()
        self._answering: frozenset[str] = frozenset()
        self._answering_icon = answering_icon()
        self.undo_label = QLabel("", self)
        self.undo_label.setObjectName("undoLabel")
        self.undo_label.setAccessibleName("Deleted conversation")
        self.undo_button = self._button("Undo", "Undo delete", self.undo_requested.emit)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        top = QHBoxLayout()
        top.addWidget(self.search_box, 1)
        top.addWidget(self.new_button)
        layout.addLayout(top)
        layout.addWidget(self.list, 1)
        undo_row = QHBoxLayout()
        undo_row.addWidget(self.undo_label, 1)
        undo_row.addWidget(self.undo_button)
        layout.addLayout(undo_row)
        self.hide_undo()
        self.search_box.textChanged.connect(self.search_changed)

    def set_conversations(self, summaries: list[ConversationSummary], current_id: str | None) -> None:
        """Show ``summaries`` in order and select ``current_id`` if it is among them.

        Only a new order or new titles of the conversations listed wait while the pointer is over the list.
        """
        if self.list.underMouse() and {summary.id for summary in summaries} == self._listed_ids():
            self._waiting = (summaries, current_id)
            return
        self._waiting = None
        self.list.blockSignals(True)
        self.list.clear()
        for summary in summaries:
            item = QListWidgetItem(summary.display_title)
            item.setData(ID_ROLE, summary.id)
            item.setData(UPDATED_ROLE, summary.updated_at)
            item.setToolTip(_tooltip(item, answering=False))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self._mark(item)
            self.list.addItem(item)
            if summary.id == current_id:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def set_answering(self, conversation_ids: frozenset[str]) -> None:
        """Mark the conversations ``conversation_ids`` as answering, and only those."""
        self._answering = frozenset(conversation_ids)
        self.list.blockSignals(True)  # item changes must not read as renames
        for row in range(self.list.count()):
            self._mark(self.list.item(row))
        self.list.blockSignals(False)

    def _listed_ids(self) -> set[str]:
        return {self.list.item(row).data(ID_ROLE) for row in range(self.list.count())}

    def answering_titles(self) -> list[str]:
        """The titles of the listed conversations marked as answering, in list order."""
        items = (self.list.item(row) for row in range(self.list.count()))
        return [item.text() for item in items if item.data(ANSWERING_ROLE)]

    def titles(self) -> list[str]:
        return [self.list.item(row).text() for row in range(self.list.count())]

    def item_for(self, conversation_id: str) -> QListWidgetItem | None:
        for row in range(self.list.count()):
            if self.list.item(row).data(ID_ROLE) == conversation_id:
                return self.list.item(row)
        return None

    def start_rename(self, conversation_id: str) -> None:
        item = self.item_for(conversation_id)
        if item is not None:
            self.list.setCurrentItem(item)
            self.list.editItem(item)

    def show_undo(self, title: str) -> None:
        self.undo_label.setText(f"Deleted “{title}”")
        self.undo_label.show()
        self.undo_button.show()

    def hide_undo(self) -> None:
        self.undo_label.hide()
        self.undo_button.hide()

    def _mark(self, item: QListWidgetItem) -> None:
        answering = item.data(ID_ROLE) in self._answering
        if bool(item.data(ANSWERING_ROLE)) == answering:
            return
        item.setData(ANSWERING_ROLE, answering)
        item.setIcon(self._answering_icon if answering else QIcon())
        item.setToolTip(_tooltip(item, answering))
        item.setData(Qt.ItemDataRole.AccessibleDescriptionRole, "answering" if answering else "")

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Delete and F2 on the list (while no title is being edited); a waiting new order when the pointer leaves."""
        if watched is self.list and event.type() == QEvent.Type.Leave and self._waiting is not None:
            self.set_conversations(*self._waiting)
        if watched is self.list and event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent):
            item = self.list.currentItem()
            if item is not None and self.list.state() != QAbstractItemView.State.EditingState:
                if event.key() == Qt.Key.Key_Delete:
                    self.delete_requested.emit(item.data(ID_ROLE))
                    return True
                if event.key() == Qt.Key.Key_F2:
                    self.list.editItem(item)
                    return True
        return super().eventFilter(watched, event)

    def _build_list(self) -> QListWidget:
        conversation_list = QListWidget(self)
        conversation_list.setObjectName("conversationList")
        conversation_list.setAccessibleName("Conversations")
        conversation_list.setAccessibleDescription("Enter opens, F2 renames, Delete deletes.")
        conversation_list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        conversation_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        conversation_list.setSpacing(2)
        conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        conversation_list.customContextMenuRequested.connect(self._show_context_menu)
        conversation_list.itemActivated.connect(lambda item: self.chosen.emit(item.data(ID_ROLE)))
        conversation_list.itemClicked.connect(lambda item: self.chosen.emit(item.data(ID_ROLE)))
        conversation_list.itemChanged.connect(lambda item: self.rename_requested.emit(item.data(ID_ROLE), item.text()))
        conversation_list.installEventFilter(self)
        return conversation_list

    def _show_context_menu(self, position: QPoint) -> None:
        item = self.list.itemAt(position)
        if item is None:
            return
        menu = QMenu(self)
        menu.addAction("&Rename").triggered.connect(lambda: self.list.editItem(item))
        menu.addAction("&Delete").triggered.connect(lambda: self.delete_requested.emit(item.data(ID_ROLE)))
        menu.popup(self.list.viewport().mapToGlobal(position))

    def _button(self, text: str, accessible_name: str, slot: Callable[[], object]) -> QPushButton:
        button = QPushButton(text, self)
        button.setAccessibleName(accessible_name)
        button.clicked.connect(slot)
        return button


def _tooltip(item: QListWidgetItem, answering: bool) -> str:
    """The whole title, whether it is answering, and when it was last used (which tells equal titles apart)."""
    title = f"{item.text()} (answering…)" if answering else item.text()
    used = time.strftime("%d %b %Y, %H:%M:%S", time.localtime(item.data(UPDATED_ROLE) or 0))
    return f"{title}\nLast used {used}"
