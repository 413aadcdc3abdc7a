"""The engine thread and the doors into it.

``worker`` owns the engine thread, the only thread that touches the model: one
loop that hands every request that arrived to ``runtime`` (one loaded model) and
then runs one step of the running replies. ``batch_runner`` runs the scheduler's
batched steps (with ``draft_model``, the draft model's own pool and steps, where the
load has one), ``sequence_runner`` the transformers fallback's one request at a
time, and ``reply_events`` sends each reply's events;
``background_load`` builds a new model on a helper thread while the old one keeps
answering. ``fanout``'s ``EngineHub`` hands the engine's events to several listeners
(the GUI and the API server), each getting its own requests' events and the global
ones. ``client`` is the asyncio side: it submits requests
from the caller's event loop (the GUI's under qasync, or the CLI's) and receives
events handed over with ``loop.call_soon_threadsafe``.
"""
