"""A dialog whose Save may fail to reach the disk (GUI thread).

On a storage error the dialog says why under its fields and stays open, so nothing
typed is lost; on success it closes as accepted.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QWidget

from app.storage import StorageError


class SavingDialog(QDialog):
    """Base for the settings dialogs: ``error_label`` to lay out, Save/Cancel buttons, ``save_then_close``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.error_label = QLabel("", self)
        self.error_label.setWordWrap(True)
        self.error_label.hide()

    def save_cancel_buttons(self) -> QDialogButtonBox:
        """Save runs ``accept``; Cancel closes without saving."""
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        return buttons

    def save_then_close(self, save: Callable[[], object]) -> None:
        """Run ``save``; close as accepted if it worked, else show why and stay open."""
        try:
            save()
        except StorageError as error:
            self.error_label.setText(str(error))
            self.error_label.show()
            return
        super().accept()
