"""The main window and what frames it (GUI thread).

``main_window`` puts the chat, the sidebar, the menus, the status line and the
performance dock together; ``menus`` keeps the menu bar's order; ``status_line``
shows what the engine is doing; ``quiet_gc`` runs Python's full garbage
collections only at quiet moments.
"""
