"""Hearth as a local OpenAI-compatible API server (``python -m engine serve``, or the app's Server menu).

The server owns ``server.py`` (the Starlette routes and the uvicorn thread),
``config.py`` (how it listens, and the rule that a non-loopback bind needs a key),
``access.py`` (the Host and API key checks), ``openai_schema.py`` (request
bodies in, OpenAI-shaped replies out), ``errors.py`` (OpenAI-shaped errors),
``engine_link.py`` (the server's door into the engine thread), ``metrics.py``
(Prometheus text) and ``standalone.py`` (the ``serve`` command).

Threads: everything here runs on the server's own thread and asyncio loop, started
by ``ApiServer``; it reaches the engine thread only through the ``EngineHub``'s
request queue, and the hub hands its events back with ``loop.call_soon_threadsafe``.
Nothing here imports torch or Qt.
"""
