"""Where the window's file dialogs open (GUI thread).

Each kind of file ("model", "export") opens where the user last picked one in this
session, else in their home folder: never the current directory, which for an app
started from a launcher is wherever the launcher happened to be.
"""

from __future__ import annotations

from pathlib import Path


class StartFolders:
    """The folder each kind of file dialog opens in; one per window."""

    def __init__(self) -> None:
        self._last_used: dict[str, Path] = {}

    def folder(self, kind: str) -> str:
        return str(self._last_used.get(kind, Path.home()))

    def remember(self, kind: str, chosen: str) -> None:
        """``chosen`` (a file, or the folder a dialog should open in) sets where the next ``kind`` dialog opens."""
        path = Path(chosen)
        self._last_used[kind] = path if path.is_dir() else path.parent
