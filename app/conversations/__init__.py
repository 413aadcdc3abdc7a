"""Conversations: the sidebar, their settings, export, and saving them as they happen (GUI thread).

``conversation`` is the Qt-free model of one chat; ``conversation_manager`` opens,
creates and deletes them; ``persistence`` journals every message to ``app.storage``
as it is sent and streamed; ``sidebar`` lists and searches them;
``conversation_settings`` and ``export_dialog`` are their dialogs;
``conversation_ui`` wires these into the window.
"""
