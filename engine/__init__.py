"""Hearth's inference engine: runs on its own thread, owns the model, never imports Qt.

Importing this package is cheap: torch and transformers are imported by the engine
thread when it first needs them, so the GUI can show its window first.
"""
