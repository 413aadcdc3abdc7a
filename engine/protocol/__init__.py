"""What crosses the queue between the engine thread and its callers, and the small types every layer shares.

``messages`` holds the requests that go in and the events that come out: frozen
dataclasses of text and numbers, never tensors or Qt objects. ``channels`` holds
the event sink and the cancel watch that the engine thread, the runtime and the
loaders all use. Imported on every thread (GUI, CLI, server, engine, loader);
imports nothing else of Hearth's and nothing heavy.
"""
