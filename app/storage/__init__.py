"""Hearth's saved data: conversations in SQLite and settings in JSON (GUI thread; no Qt, no torch).

Start-up: ``store, notice = ChatStore.open_or_start_fresh()``, then ``store.recover_interrupted()``,
and ``load_settings()``; ``store.unsaved.watch`` gives the lasting warning while a finished reply
is not saved yet (a full disk), and ``store.save_unsaved()`` retries it. See store.py,
recorder.py, unsaved.py, settings.py and export.py for the calls.
"""

from app.storage.errors import (
    DamagedDatabaseError, NewerDatabaseError, NotFoundError, ReadOnlyDatabaseError, StorageError,
)
from app.storage.export import export_json, export_markdown
from app.storage.recorder import ReplyRecorder
from app.storage.records import Conversation, ConversationSummary, Message
from app.storage.settings import LoadedSettings, SamplingSettings, Settings, load_settings, save_settings
from app.storage.store import ChatStore

__all__ = [
    "ChatStore",
    "Conversation",
    "ConversationSummary",
    "DamagedDatabaseError",
    "LoadedSettings",
    "Message",
    "NewerDatabaseError",
    "NotFoundError",
    "ReadOnlyDatabaseError",
    "ReplyRecorder",
    "SamplingSettings",
    "Settings",
    "StorageError",
    "export_json",
    "export_markdown",
    "load_settings",
    "save_settings",
]
