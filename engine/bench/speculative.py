"""``python -m engine.bench speculative``: single-stream decode with and without drafts (the bench's main thread).

Drafts come from prompt lookup, or with ``--draft-model`` from that model (the
batch runner's draft source: ``engine/service/draft_model.py``). Two tasks, each
replied to greedily through the batch runner (``runner_replies``)
with ``SamplingParams.speculative`` off and on, taking turns within each round so both
see the same machine load: ``edit`` pastes a piece of code and asks for it back with
a rename (the reply repeats most of its context, where prompt lookup drafts pay),
``chat`` is a free question (little to look up: drafting must cost next to
nothing). Each prompt is computed once before the rounds, and every reply reuses it
from the cache: a prompt prefilled whole and one whose last tokens are computed
beside its cached prefix differ in their last bits, which can tip a near tie. One
JSON line per reply (decode rate, drafted and accepted tokens, tokens per step);
the summary gives each task's median rates, their ratio, the acceptance, tokens per
step and whether the two texts were identical in every round, with the CPU and the
kernels that ran.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from typing import Any, Callable

from engine.bench.bench_models import open_bench_model
from engine.bench.runner_replies import ReplyDriver
from engine.forward.native.build import kernels_variant
from engine.host.cpu_features import cpu_name
from engine.host.cpu_threads import engine_threads
from engine.protocol.messages import DEVICES, GREEDY, PRECISIONS, ChatMessage

CODE = '''class Inventory:
    """Items in stock and their prices."""

    def __init__(self):
        self.items = {}
        self.prices = {}

    def add_item(self, name, count, price):
        self.items[name] = self.items.get(name, 0) + count
        self.prices[name] = price

    def remove_item(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total_value(self):
        return sum(self.items[name] * self.prices[name] for name in self.items)

    def report(self):
        for name in sorted(self.items):
            print(name, self.items[name], self.prices[name])
'''
TASKS = {
    "edit": f"Rename the method add_item to add and remove_item to remove in this code, and write the whole "
            f"code again:\n\n{CODE}",
    "chat": "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
}
Show = Callable[[dict[str, Any]], None]


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    command = commands.add_parser("speculative", help="single-stream decode with and without drafts")
    command.add_argument("--device", default="cpu", choices=DEVICES)
    command.add_argument("--quant", default="auto", choices=("none", *PRECISIONS))
    command.add_argument("--new-tokens", type=int, default=128)
    command.add_argument("--rounds", type=int, default=3, help="replies with and without drafts, taking turns")
    command.add_argument("--draft-model", metavar="PATH|default|random-gguf:…",
                         help="draft with this model (same tokenizer) instead of prompt lookup")
    return command


def run(args: argparse.Namespace, show: Show) -> dict[str, Any]:
    loaded = open_bench_model(args.model, args.device, args.quant, args.draft_model)
    if args.draft_model is not None and loaded.draft is None:
        raise ValueError(f"the draft model was refused: {loaded.notices[-1]}")
    prompts = {task: loaded.tokenize(loaded.render((ChatMessage("user", text),))) for task, text in TASKS.items()}
    driver = ReplyDriver(loaded, max(len(p) for p in prompts.values()) + args.new_tokens)
    for task, prompt in prompts.items():  # each prompt cached once: every measured reply reuses it alike
        driver.reply(prompt, 1, conversation_id=f"{task}-cached")
    rows: list[dict[str, Any]] = []
    for round_index in range(max(args.rounds, 1)):
        for task, prompt in prompts.items():
            for drafting in (False, True):
                rows.append(_reply(driver, task, prompt, drafting, args.new_tokens, round_index))
                show(rows[-1])
    summary: dict[str, Any] = {"model": args.model, "draft_model": args.draft_model or "prompt lookup",
                               "device": loaded.device, "precision": loaded.precision,
                               "draft_precision": loaded.draft.precision if loaded.draft else None,
                               "cpu": cpu_name(), "threads": engine_threads(),
                               "kernels": kernels_variant(loaded.device),
                               "new_tokens": args.new_tokens, "rounds": args.rounds}
    for task in TASKS:
        summary |= _task_summary(task, [row for row in rows if row["task"] == task])
    return summary


def _reply(driver: ReplyDriver, task: str, prompt: list[int], drafting: bool, new_tokens: int,
           round_index: int) -> dict[str, Any]:
    """One greedy reply, each in its own conversation, its prompt found in the cache."""
    sampling = replace(GREEDY, speculative=drafting)
    reply = driver.reply(prompt, new_tokens, f"{task}-{drafting}-{round_index}", sampling)
    stats = reply.stats
    return {"task": task, "drafting": drafting, "round": round_index, "prompt_tokens": len(prompt),
            "tokens_generated": stats.tokens_generated, "decode_tok_s": round(stats.decode_tok_s, 2),
            "drafted_tokens": stats.drafted_tokens, "accepted_tokens": stats.accepted_tokens,
            "tokens_per_step": round(stats.tokens_per_step, 2), "text": reply.text}


def _task_summary(task: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median decode rates off and on, their ratio, the acceptance, and whether each round's texts agreed."""
    plain = [row for row in rows if not row["drafting"]]
    drafted = [row for row in rows if row["drafting"]]
    plain_rate = statistics.median(row["decode_tok_s"] for row in plain)
    drafted_rate = statistics.median(row["decode_tok_s"] for row in drafted)
    proposed = sum(row["drafted_tokens"] for row in drafted)
    return {
        f"{task}_decode_tok_s": plain_rate,
        f"{task}_drafted_decode_tok_s": drafted_rate,
        f"{task}_speedup": round(drafted_rate / plain_rate, 2) if plain_rate else None,
        f"{task}_acceptance": round(sum(row["accepted_tokens"] for row in drafted) / proposed, 2) if proposed else None,
        f"{task}_tokens_per_step": statistics.median(row["tokens_per_step"] for row in drafted),
        f"{task}_identical_text": all(a["text"] == b["text"] for a, b in zip(plain, drafted)),
    }
