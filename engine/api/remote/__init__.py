"""The client of remote OpenAI-compatible engines (run by its own engine thread).

It lets Hearth chat with a bigger engine elsewhere (vLLM, llama.cpp's
``llama-server``, Ollama, LM Studio): ``runtime`` is a ``Runtime`` behind the same
requests and events as the embedded model, ``reply`` streams one answer,
``http_stream`` opens the connections and reads a streamed answer line by line,
``watched_socket`` lets every wait on the server end on a Cancel or a deadline,
and ``openai_stream`` builds the request body and reads the server-sent events.
Nothing here imports torch or Qt.
"""
