"""A terminal chat on the engine, without Qt: ``python -m engine chat --model default``.

``python -m engine serve`` (the OpenAI-compatible API server) is parsed here and
run by ``engine.api.server.standalone``.

Runs on the main thread; the model lives on the engine thread as in the app, and
events come back through a plain queue. With ``--prompt`` it answers once;
without, it is an interactive chat that keeps the conversation across turns.
"""

from __future__ import annotations

import argparse
import queue
import sys
import uuid

from engine.api.server.standalone import (
    add_context_option,
    add_draft_option,
    add_kv_cache_option,
    add_serve_command,
    load_line,
    load_options,
    serve,
)
from engine.protocol.messages import (
    ChatMessage,
    EngineError,
    Event,
    FetchProgress,
    Generate,
    LoadFailed,
    LoadModel,
    LoadOptions,
    ModelLoaded,
    PRECISIONS,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    StatusChanged,
    TokenStreamed,
    canonical_precision,
)
from engine.service.worker import EngineThread

EXIT_FAILED = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Chat with a local model in the terminal, or serve it.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)
    chat = commands.add_parser("chat", help="chat with a model")
    chat.add_argument("--model", default="default", help='"default", a model folder or a .gguf file')
    chat.add_argument("--prompt", help="answer this one message and exit")
    chat.add_argument("--system", default="", help="system prompt")
    chat.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    chat.add_argument("--precision", default="auto", type=canonical_precision, choices=PRECISIONS)
    add_context_option(chat)
    add_kv_cache_option(chat)
    add_draft_option(chat)
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    chat.add_argument("--seed", type=int)
    return parser.parse_args(argv)


class TerminalChat:
    """Drives the engine thread from the terminal; one reply at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._events: queue.Queue[Event] = queue.Queue()
        self._engine = EngineThread(self._events.put)
        self._sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_tokens, seed=args.seed)
        self._history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
        self._conversation_id = uuid.uuid4().hex

    def load(self, path: str, options: LoadOptions) -> bool:
        self._engine.start()
        self._engine.submit(LoadModel("load", path, options))
        while True:
            event = self._events.get()
            if isinstance(event, ModelLoaded):
                for notice in event.notices:
                    print(f"[{notice}]", file=sys.stderr)
                print(f"[{load_line(event)}, loaded in {event.load_s:.1f} s]", file=sys.stderr)
                return True
            if isinstance(event, (LoadFailed, EngineError)):
                print(f"error: {event.message}", file=sys.stderr)
                return False
            _report_progress(event)

    def ask(self, text: str) -> bool:
        self._history.append(ChatMessage("user", text))
        self._engine.submit(Generate(uuid.uuid4().hex, self._conversation_id, tuple(self._history), self._sampling))
        reading_shown = False
        while True:
            event = self._events.get()
            if isinstance(event, PromptProgress):
                print(f"\r[reading the prompt: {100 * event.computed_tokens // event.prompt_tokens} % of "
                      f"{event.prompt_tokens} tokens]", end="", file=sys.stderr, flush=True)
                reading_shown = True
            elif isinstance(event, PrefillDone) and reading_shown:
                print(file=sys.stderr)
            elif isinstance(event, TokenStreamed):
                print(event.text, end="", flush=True)
            elif isinstance(event, ReplyFinished):
                print(f"\n[{event.stats.tokens_generated} tokens, {event.stats.decode_tok_s:.1f} tok/s, "
                      f"first token {event.stats.ttft_ms:.0f} ms, {event.stats.finish_reason}]", file=sys.stderr)
                self._history.append(ChatMessage("assistant", event.text))
                return True
            elif isinstance(event, (ReplyFailed, EngineError)):
                print(f"\nerror: {event.message}", file=sys.stderr)
                self._history.pop()
                return False

    def close(self) -> None:
        self._engine.stop()


def _report_progress(event: Event) -> None:
    if isinstance(event, StatusChanged) and event.detail:
        print(f"[{event.detail}]", file=sys.stderr)
    elif isinstance(event, FetchProgress) and event.total_bytes:
        print(f"\r[download {100 * event.done_bytes // event.total_bytes}%]", end="", file=sys.stderr, flush=True)


def _interactive(chat: TerminalChat) -> int:
    print("Type a message; an empty line or Ctrl+D quits.", file=sys.stderr)
    while True:
        try:
            text = input("> ").strip()
        except EOFError:
            return 0
        if not text:
            return 0
        chat.ask(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        return serve(args)
    chat = TerminalChat(args)
    try:
        if not chat.load(args.model, load_options(args)):
            return EXIT_FAILED
        if args.prompt is not None:
            return 0 if chat.ask(args.prompt) else EXIT_FAILED
        return _interactive(chat)
    except KeyboardInterrupt:
        return 130
    finally:
        chat.close()
