"""File > Export…: save one conversation as Markdown or JSON where the user chooses (GUI thread).

The format follows the chosen filter, or the file's extension when it has one. The file is
written to a temporary name and renamed over the target, so a failed export never leaves a
half-written file; failures become a message, the conversation is untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.storage import ChatStore, StorageError, export_json, export_markdown
from app.window.start_folder import StartFolders

MARKDOWN_FILTER = "Markdown (*.md)"
JSON_FILTER = "JSON (*.json)"


def export_text(store: ChatStore, conversation_id: str, as_json: bool) -> str:
    conversation = store.load_conversation(conversation_id)
    return export_json(conversation) if as_json else export_markdown(conversation)


def write_export(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; raises ``StorageError`` with a clear message."""
    temporary = ""
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except OSError as error:
        if temporary:
            Path(temporary).unlink(missing_ok=True)
        raise StorageError(f"Could not export to {path}: {error.strerror or error}.") from error


def export_conversation(parent: QWidget, store: ChatStore, conversation_id: str, title: str,
                        folders: StartFolders) -> str | None:
    """Ask where to save (in ``folders``' export folder), then export; a message for the user, or None if cancelled."""
    suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
    path_text, chosen_filter = QFileDialog.getSaveFileName(
        parent, "Export conversation", str(Path(folders.folder("export")) / f"{suggested}.md"),
        f"{MARKDOWN_FILTER};;{JSON_FILTER}",
    )
    if not path_text:
        return None
    folders.remember("export", path_text)
    path = Path(path_text)
    as_json = path.suffix.lower() == ".json" or (path.suffix.lower() != ".md" and chosen_filter == JSON_FILTER)
    if not path.suffix:
        path = path.with_suffix(".json" if as_json else ".md")
    try:
        write_export(path, export_text(store, conversation_id, as_json))
    except StorageError as error:
        return str(error)
    return f"Exported to {path}."
