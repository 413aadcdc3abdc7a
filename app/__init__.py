"""Hearth's Qt interface: runs on the GUI thread and never imports torch.

The engine (``engine/``) owns the model on its own thread; this package only sees
the frozen messages of ``engine.protocol.messages``, through ``app.controller``.
"""
