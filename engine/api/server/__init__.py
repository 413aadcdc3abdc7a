"""Hearth's OpenAI-compatible HTTP server (its own thread and asyncio loop).

``python -m engine serve`` or the app's Server menu starts it. ``server.py`` holds
the Starlette routes and the uvicorn thread, ``config.py`` how it listens (and the
rule that a non-loopback bind needs a key), ``access.py`` the Host and API key
checks, ``openai_schema.py`` request bodies in and OpenAI-shaped replies out,
``errors.py`` OpenAI-shaped errors, ``slow_clients.py`` the deadline on request
headers, ``engine_link.py`` the server's door into the engine thread,
``metrics.py`` Prometheus text and ``standalone.py`` the ``serve`` command. It reaches the engine thread only through the ``EngineHub``'s request
queue; the hub hands events back with ``loop.call_soon_threadsafe``. Nothing here
imports torch or Qt.
"""
