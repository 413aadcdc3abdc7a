"""The OpenAI-compatible HTTP API, both ways: Hearth's own server, and the client of remote servers.

The server (``python -m engine serve``, or the app's Server menu) owns ``server.py``
(the Starlette routes and the uvicorn thread), ``config.py`` (how it listens, and the
rule that a non-loopback bind needs a key), ``access.py`` (the Host and API key
checks), ``openai_schema.py`` (request bodies in, OpenAI-shaped replies out),
``errors.py`` (OpenAI-shaped errors), ``engine_link.py`` (the server's door into the
engine thread), ``metrics.py`` (Prometheus text) and ``standalone.py`` (the ``serve``
command). It runs on its own thread and asyncio loop, started by ``ApiServer``, and
reaches the engine thread only through the ``EngineHub``'s request queue; the hub
hands its events back with ``loop.call_soon_threadsafe``.

The client lets Hearth chat with a bigger engine elsewhere (vLLM, llama.cpp's
``llama-server``, Ollama, LM Studio): ``remote_runtime`` is a ``Runtime`` run by its
own engine thread, behind the same requests and events as the embedded model;
``remote_http`` opens the connections and reads a streamed answer line by line;
``openai_stream`` builds the request body and reads the server-sent events.
Nothing here imports torch or Qt.
"""
