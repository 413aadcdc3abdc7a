"""``python -m engine serve``: the API server owning its own engine thread (main thread waits).

Loads the model, then serves until Ctrl+C. The engine thread and the server thread
are the same kinds as inside the app; here the main thread only starts them,
reports the load, and waits.
"""

from __future__ import annotations

import argparse
import sys
import threading

from engine.api.server.config import DEFAULT_MAX_BODY_BYTES, ServerConfig
from engine.api.server.server import ApiServer
from engine.protocol.messages import KV_CACHES, PRECISIONS, LoadModel, LoadOptions, ModelLoaded, canonical_precision
from engine.service.fanout import EngineHub

EXIT_FAILED = 2


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    serve.add_argument("--model", default="default", help='"default", a model folder or a .gguf file')
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (anything but loopback needs --api-key)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request but /health")
    serve.add_argument("--cors-origin", action="append", default=[], help="allow this web origin (repeatable); none by default")
    serve.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    serve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    serve.add_argument("--precision", default="auto", type=canonical_precision, choices=PRECISIONS)
    add_context_option(serve)
    add_kv_cache_option(serve)
    add_draft_option(serve)


def add_context_option(command: argparse.ArgumentParser) -> None:
    """``--context N``: the context length to load with (at most the trained one; it must fit). Without it, the
    longest that fits comfortably, up to 32 768 tokens (``context_choice``)."""
    command.add_argument("--context", type=context_tokens, metavar="TOKENS",
                         help="context length in tokens (default: what fits, up to 32768; at most the trained length)")


def add_kv_cache_option(command: argparse.ArgumentParser) -> None:
    """``--kv-cache {auto,bf16,int8}``: the KV cache's precision (``LoadOptions.kv_cache``); int8 on the CPU only."""
    command.add_argument("--kv-cache", default="auto", choices=KV_CACHES,
                         help="KV cache precision: auto (bf16 on the CPU), bf16, or int8 (half the memory, CPU only)")


def context_tokens(text: str) -> int:
    """A ``--context`` value: a whole number of tokens, at least 1."""
    try:
        tokens = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
    if tokens < 1:
        raise argparse.ArgumentTypeError("the context must be at least 1 token")
    return tokens


def add_draft_option(command: argparse.ArgumentParser) -> None:
    """``--draft-model PATH|default``: a small model with the same tokenizer drafting tokens for the model to verify
    (``LoadOptions.draft_model``)."""
    command.add_argument("--draft-model", metavar="PATH|default",
                         help='a small model with the same tokenizer that drafts for the model ("default": the '
                              "built-in one); the load notice says when it cannot")


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The ``LoadOptions`` that ``chat`` and ``serve``'s ``--device``, ``--precision``, ``--context``,
    ``--kv-cache`` and ``--draft-model`` ask for."""
    return LoadOptions(device=args.device, precision=args.precision, context_length=args.context,
                       kv_cache=args.kv_cache, draft_model=args.draft_model)


def load_line(loaded: ModelLoaded) -> str:
    """The loaded model in one line for the terminal: name, device, formats, context, KV cache and draft model."""
    kv = f", {loaded.kv_cache} KV cache" if loaded.kv_cache else ""
    drafting = f", drafting with {loaded.draft_model}" if loaded.draft_model else ""
    return (f"{loaded.name} on {loaded.device}, {loaded.precision}, {loaded.context_length}-token context{kv}"
            f"{drafting}")


def serve(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    config = ServerConfig(args.host, args.port, args.api_key, tuple(args.cors_origin), args.max_body_bytes)
    try:
        config.check()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    hub = EngineHub()
    hub.start()
    try:
        return _serve_loaded(hub, config, load_options(args), args.model, stop)
    except KeyboardInterrupt:
        return 0
    finally:
        hub.stop()


def _serve_loaded(hub: EngineHub, config: ServerConfig, options: LoadOptions, model: str, stop: threading.Event | None) -> int:
    server = ApiServer(hub, config)
    try:
        server.start()  # answers /health with 503 while the model loads
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"[serving on {server.url}; loading {model}…]", file=sys.stderr)
    try:
        loaded = hub.load_and_wait(LoadModel("serve-load", model, options))
        if not isinstance(loaded, ModelLoaded):
            print(f"error: {loaded.message}", file=sys.stderr)
            return EXIT_FAILED
        for notice in loaded.notices:
            print(f"[{notice}]", file=sys.stderr)
        print(f"[{load_line(loaded)}; model id '{loaded.name}' at {server.url}]", file=sys.stderr)
        (stop or threading.Event()).wait()
        return 0
    finally:
        server.stop()
