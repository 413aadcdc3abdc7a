"""Does the performance panel slow decoding? Real engine, real window, panel open vs closed (GUI thread).

    python -m app.perf.bench.panel --json [--model PATH] [--rounds 6] [--tokens 64]

Loads the model in a real ``MainWindow`` (offscreen unless ``QT_QPA_PLATFORM``
says otherwise), then asks for short greedy replies, alternating the panel open
and closed (ABBA order per pair of rounds, so drift on a shared machine hits both
sides alike). Each reply's decode speed is the engine's own
``ReplyFinished.stats.decode_tok_s``. The issue's rule: with the panel open,
decode speed stays within 3 % of it closed. Prints one JSON line per reply and
a summary line last (or a short table without ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from dataclasses import replace
from typing import Any

import qasync
from PySide6.QtCore import SignalInstance
from PySide6.QtWidgets import QApplication

from app.controller import EngineController
from app.main import quiet_collector
from app.models.model_picker import DEFAULT_MODEL
from app.window.main_window import MainWindow
from engine.protocol.messages import GREEDY, ChatMessage, LoadFailed, ModelLoaded, ReplyFailed, ReplyFinished
from engine.service.client import AsyncEngine

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
ALLOWED_SLOWDOWN = 0.03
REPLY_TIMEOUT_S = 600.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.perf.bench.panel", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="PATH", help="a model folder or .gguf file")
    parser.add_argument("--rounds", type=int, default=6, help="replies per side (panel open, panel closed)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per reply")
    parser.add_argument("--json", action="store_true", help="print JSON lines, a summary last")
    return parser.parse_args(argv)


async def next_emission(signal: SignalInstance, request_id: str) -> Any:
    """The next event of ``signal`` for ``request_id``."""
    arrived: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def take(event: Any) -> None:
        if event.request_id == request_id and not arrived.done():
            arrived.set_result(event)

    signal.connect(take)
    try:
        return await asyncio.wait_for(arrived, REPLY_TIMEOUT_S)
    finally:
        signal.disconnect(take)


async def first_of(*waiting: asyncio.Future[Any]) -> Any:
    done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return done.pop().result()


async def outcome(done: SignalInstance, failed: SignalInstance, request_id: str, what: str) -> Any:
    """The event ending ``request_id``; a failure ends the benchmark with its message."""
    ending = await first_of(
        asyncio.ensure_future(next_emission(done, request_id)),
        asyncio.ensure_future(next_emission(failed, request_id)),
    )
    if isinstance(ending, (LoadFailed, ReplyFailed)):
        raise SystemExit(f"{what} failed: {ending.message}")
    return ending


async def load(controller: EngineController, window: MainWindow, model: str) -> ModelLoaded:
    request_id = window.model_loader.load(model)
    return await outcome(controller.model_loaded, controller.load_failed, request_id, "Loading the model")


async def one_reply(controller: EngineController, window: MainWindow, max_new_tokens: int) -> ReplyFinished:
    """A greedy reply in a fresh conversation, so every reply prefills the same prompt.

    The panel shows it as the reply of the conversation on screen, as it would a reply sent from the window.
    """
    sampling = replace(GREEDY, max_new_tokens=max_new_tokens)
    request_id = controller.send_prompt(uuid.uuid4().hex, (ChatMessage("user", PROMPT),), sampling)
    window.performance_dock.panel.track_reply(request_id, window.session.conversation.id)
    return await outcome(controller.reply_finished, controller.reply_failed, request_id, "A reply")


def panel_order(round_index: int) -> tuple[bool, bool]:
    """Open first on even rounds, closed first on odd ones (ABBA)."""
    return (True, False) if round_index % 2 == 0 else (False, True)


async def measure(window: MainWindow, controller: EngineController, args: argparse.Namespace) -> list[dict[str, Any]]:
    await one_reply(controller, window, args.tokens)  # warm-up: first-call allocations and caches
    rows = []
    for round_index in range(args.rounds):
        for panel_open in panel_order(round_index):
            window.performance_dock.setVisible(panel_open)
            await asyncio.sleep(0.2)  # let the dock show or hide before decoding starts
            finished = await one_reply(controller, window, args.tokens)
            row = {
                "round": round_index,
                "panel": "open" if panel_open else "closed",
                "decode_tok_s": round(finished.stats.decode_tok_s, 2),
                "tokens": finished.stats.tokens_generated,
            }
            rows.append(row)
            emit_row(row, args.json)
    return rows


def summarise(rows: list[dict[str, Any]], loaded: ModelLoaded) -> dict[str, Any]:
    speeds = {side: [row["decode_tok_s"] for row in rows if row["panel"] == side] for side in ("open", "closed")}
    open_median, closed_median = statistics.median(speeds["open"]), statistics.median(speeds["closed"])
    ratio = open_median / closed_median
    return {
        "summary": True,
        "model": loaded.name,
        "device": loaded.device,
        "precision": loaded.precision,
        "replies_per_side": len(speeds["open"]),
        "open_median_tok_s": round(open_median, 2),
        "closed_median_tok_s": round(closed_median, 2),
        "open_mean_tok_s": round(statistics.mean(speeds["open"]), 2),
        "closed_mean_tok_s": round(statistics.mean(speeds["closed"]), 2),
        "ratio_open_to_closed": round(ratio, 4),
        "within_3_percent": ratio >= 1 - ALLOWED_SLOWDOWN,
    }


def emit_row(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
    elif row.get("summary"):
        print(
            f"{row['model']} on {row['device']} ({row['precision']}): panel open {row['open_median_tok_s']} tok/s, "
            f"closed {row['closed_median_tok_s']} tok/s (median of {row['replies_per_side']}), "
            f"ratio {row['ratio_open_to_closed']:.3f}, within 3 %: {row['within_3_percent']}",
            flush=True,
        )
    else:
        print(f"round {row['round']}, panel {row['panel']:>6}: {row['decode_tok_s']:.1f} tok/s", flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    controller = EngineController()
    window = MainWindow(controller)
    window.resize(1200, 800)
    window.show()
    collector = quiet_collector(controller, window)  # as app.main does at start-up
    controller.start(AsyncEngine())
    try:
        loaded = await load(controller, window, args.model)
        summary = summarise(await measure(window, controller, args), loaded)
    finally:
        controller.close()
        collector.stop()
        window.close()
    emit_row(summary, args.json)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication([sys.argv[0]])  # must stay referenced while the loop runs
    summary = qasync.run(run(args))
    app.processEvents()
    return 0 if summary["within_3_percent"] else 1


if __name__ == "__main__":
    sys.exit(main())
