"""Picking and loading a model (GUI thread).

``model_picker`` runs File › Open model… and the recent-models menu
(``recent_models``); ``load_dialog`` shows the engine's memory estimate per
precision and the chosen settings; ``load_progress`` is the progress bar with
its Cancel button. ``remote_picker`` runs File › Connect to server…: its
``remote_dialog`` lists a remote server's models to pick one from.
"""
