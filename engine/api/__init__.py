"""The OpenAI-compatible HTTP API, both ways: the server and the client of remote servers.

The server side makes Hearth's engine answer ``/v1/chat/completions`` for other
programs. The client side lets Hearth chat with a bigger engine elsewhere (vLLM,
llama.cpp's ``llama-server``, Ollama, LM Studio): ``remote_runtime`` is a
``Runtime`` run by its own engine thread, behind the same requests and events as
the embedded model; ``remote_http`` opens the connections and reads a streamed
answer line by line; ``openai_stream`` builds the request body and reads the
server-sent events. The client imports neither torch nor Qt.
"""
