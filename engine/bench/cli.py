"""``python -m engine.bench``: decode speed, multi-turn reuse and load time, as JSON lines (main thread).

    decode --model default|PATH|random:NAME --device auto|cpu|cuda --quant none|int8|nf4|auto
           --prompt-tokens N --new-tokens N [--baseline] [--rounds N]
    prefill --model … --device … --quant … --prompt-tokens 4096 [--repeats N]
    chat   --model … --device … --quant … --context-tokens 4096 --new-tokens 50 [--repeats N]
    turns  --model default --turns 20 [--repeats N]
    load   --model PATH [--cycles N]
    remote --url URL --model ID [--api-key KEY] [--new-tokens N] [--rounds N]

One JSON object per line on stdout (``--json``; without it, ``key=value`` lines);
the last line is the summary. Baselines run in the same process, taking turns
with the engine, so both see the same machine load; the summary gives medians. A failure prints
``{"ok": false, "error": …}`` as the last line and exits with status 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

from engine.bench import remote_client
from engine.protocol.messages import LoadOptions

QUANT_PRECISION = {"int8": "int8", "nf4": "nf4", "auto": "auto"}
WARMUP_TOKENS = 4


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    show = _printer(args.json)
    try:
        import torch

        from engine.host.allocator import keep_freed_buffers

        torch.set_grad_enabled(False)
        keep_freed_buffers()  # as the app's engine does
        summary = COMMANDS[args.command](args, show)
    except Exception as exc:  # the bench reports every failure as data, never as a traceback
        show({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 2
    show({"ok": True, **summary})
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode", help="tokens per second and time to first token")
    decode.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    decode.add_argument("--quant", default="auto", choices=("none", "int8", "nf4", "auto"))
    decode.add_argument("--prompt-tokens", type=int, default=128)
    decode.add_argument("--new-tokens", type=int, default=128)
    decode.add_argument("--baseline", action="store_true", help="also time plain model.generate()")
    decode.add_argument("--rounds", type=int, default=3, help="engine and baseline runs, taking turns")
    prefill = commands.add_parser("prefill", help="time to feed a long prompt into an empty cache")
    prefill.add_argument("--prompt-tokens", type=int, default=4096)
    chat = commands.add_parser("chat", help="time to first token of a new message after a long cached chat")
    chat.add_argument("--context-tokens", type=int, default=4096)
    chat.add_argument("--new-tokens", type=int, default=50)
    for command in (prefill, chat):
        command.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
        command.add_argument("--quant", default="auto", choices=("none", "int8", "nf4", "auto"))
        command.add_argument("--repeats", type=int, default=5)
    turns = commands.add_parser("turns", help="time to first token over a long conversation, reused vs fresh cache")
    turns.add_argument("--turns", type=int, default=20)
    turns.add_argument("--reply-tokens", type=int, default=48)
    turns.add_argument("--repeats", type=int, default=3, help="reused times to first token per turn (median)")
    load = commands.add_parser("load", help="load time and weight size")
    load.add_argument("--cycles", type=int, default=1, help="load and unload this many times, reporting memory")
    for command in (decode, prefill, chat, turns, load):
        command.add_argument("--model", default="default")
        command.add_argument("--json", action="store_true", help="JSON lines (else key=value lines)")
    remote_client.add_arguments(commands.add_parser("remote", help="Hearth's remote client vs a bare one, on a server"))
    return parser


def _printer(as_json: bool):
    def show(record: dict[str, Any]) -> None:
        line = json.dumps(record) if as_json else "  ".join(f"{k}={v}" for k, v in record.items())
        print(line, flush=True)

    return show


def _open(path: str, device: str, quant: str) -> Any:
    """The model as the engine loads it: same precision choice, same backend."""
    from engine.models.loading import resolve_device
    from engine.models.model_open import open_model
    from engine.models.random_models import is_random, load_random

    chosen = resolve_device(device)
    precision = QUANT_PRECISION.get(quant) or ("bf16" if chosen.type == "cuda" else "fp32")
    if is_random(path):
        return load_random(path, chosen.type, precision)
    return open_model(path, LoadOptions(chosen.type, precision), lambda _: None, lambda *_: None, lambda: False)


def _decode(args: argparse.Namespace, show) -> dict[str, Any]:
    import torch

    from engine.bench import measure as measure
    from engine.host.cpu_threads import apply_engine_threads

    threads = {"hf": torch.get_num_threads(), "engine": apply_engine_threads()}  # generate() as a user runs it
    loaded = _open(args.model, args.device, args.quant)
    device = torch.device(loaded.device)
    prompt = measure.filler_prompt(loaded.tokenize, args.prompt_tokens)
    measure.reset_peak_memory(device)
    measure.measure_engine_decode(loaded, prompt[:8], WARMUP_TOKENS)
    first = measure.measure_engine_decode(loaded, prompt, args.new_tokens)
    engine_peak = measure.peak_memory_bytes(device)  # before any baseline model exists
    kv_bytes = measure.cache_bytes_for(loaded, prompt)
    bandwidth = measure.copy_bandwidth(device)
    decode_bytes = getattr(loaded.model, "decode_bytes", loaded.weight_bytes)  # transformers models: all weights
    summary = {
        "model": args.model, "device": loaded.device, "precision": loaded.precision,
        "backend": type(loaded.backend).__name__, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
        "weight_bytes": loaded.weight_bytes, "decode_bytes": decode_bytes, "copy_bandwidth_bytes_s": round(bandwidth),
        "bandwidth_limit_tok_s": round(bandwidth / decode_bytes, 1),  # each weight read once per token
        "peak_memory_bytes": engine_peak, "engine_threads": threads["engine"], "kv_cache_bytes": kv_bytes,
        "peak_over_weights_kv": round(engine_peak / (loaded.weight_bytes + kv_bytes), 3) if device.type == "cuda" else None,
        "notices": list(loaded.notices),
    }
    hf_model = _baseline_model(args.model, loaded, prompt) if args.baseline else None
    return summary | _rounds(loaded, hf_model, prompt, args, threads, first, show)


def _rounds(loaded: Any, hf_model: Any, prompt: list[int], args: argparse.Namespace, threads: dict[str, int],
            first: Any, show) -> dict[str, Any]:
    """Engine and ``generate()`` take turns, ``--rounds`` times, so both see the same shifts in machine load;
    the summary holds the medians."""
    import torch

    from engine.bench import measure as measure

    engine_runs, hf_runs = [first], []
    for index in range(args.rounds):
        if index:
            torch.set_num_threads(threads["engine"])
            engine_runs.append(measure.measure_engine_decode(loaded, prompt, args.new_tokens))
        if hf_model is not None:
            torch.set_num_threads(threads["hf"])
            hf_runs.append(measure.measure_hf_generate(hf_model, loaded.tokenizer, prompt, args.new_tokens))
        show({"round": index + 1, "engine_decode_tok_s": round(engine_runs[-1].decode_tok_s, 2),
              **({"hf_decode_tok_s": round(hf_runs[-1].decode_tok_s, 2)} if hf_runs else {})})
    engine = _median_run(engine_runs)
    found = {"rounds": args.rounds, "engine_decode_tok_s": round(engine.decode_tok_s, 2),
             "engine_ttft_ms": round(engine.ttft_ms, 1)}
    if not hf_runs:
        return found
    hf = _median_run(hf_runs)
    return found | {
        "hf_decode_tok_s": round(hf.decode_tok_s, 2), "hf_ttft_ms": round(hf.ttft_ms, 1), "hf_threads": threads["hf"],
        "speedup": round(engine.decode_tok_s / hf.decode_tok_s, 2) if hf.decode_tok_s else None,
        "same_text_as_hf": all(run.text == hf_runs[0].text for run in engine_runs + hf_runs),
    }


def _median_run(runs: list[Any]) -> Any:
    return sorted(runs, key=lambda run: run.decode_tok_s)[len(runs) // 2]


def _baseline_model(model_path: str, loaded: Any, prompt: list[int]) -> Any:
    """A transformers copy for plain ``generate()``: fp32 on the CPU, the engine's dtype on a GPU; warmed up."""
    import torch

    from engine.bench import measure as measure

    device = torch.device(loaded.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = _hf_model(model_path, loaded.path, device, dtype)
    measure.measure_hf_generate(model, loaded.tokenizer, prompt[:8], WARMUP_TOKENS)
    return model


def _hf_model(model_path: str, folder: str, device: Any, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    from engine.models.random_models import PREFIX, build_hf_model, is_random

    if is_random(model_path):
        return build_hf_model(model_path[len(PREFIX):], device, dtype)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def _prefill(args: argparse.Namespace, show) -> dict[str, Any]:
    """Median time to prefill ``--prompt-tokens`` tokens from an empty cache (after one warm-up run)."""
    from engine.bench import measure as measure

    loaded = _open(args.model, args.device, args.quant)
    prompt = measure.filler_prompt(loaded.tokenize, args.prompt_tokens)
    measure.measure_prefill_ms(loaded, prompt, 1)
    times = sorted(measure.measure_prefill_ms(loaded, prompt, args.repeats))
    median = times[len(times) // 2]
    return {
        **_described(args.model, loaded), "prompt_tokens": len(prompt), "prefill_ms": round(median, 2),
        "prefill_ms_best": round(times[0], 2), "prefill_tok_s": round(len(prompt) / (median / 1000), 1),
    }


def _chat(args: argparse.Namespace, show) -> dict[str, Any]:
    """Median time to first token for ``--new-tokens`` new tokens after ``--context-tokens`` cached ones."""
    from engine.bench import measure as measure

    loaded = _open(args.model, args.device, args.quant)
    ids = measure.filler_prompt(loaded.tokenize, args.context_tokens + args.new_tokens)
    context, new = ids[: args.context_tokens], ids[args.context_tokens :]
    measure.measure_cached_ttft_ms(loaded, context[:64], new, 1)
    times = sorted(measure.measure_cached_ttft_ms(loaded, context, new, args.repeats))
    return {
        **_described(args.model, loaded), "context_tokens": len(context), "new_tokens": len(new),
        "ttft_ms": round(times[len(times) // 2], 2), "ttft_ms_best": round(times[0], 2),
    }


def _described(model_path: str, loaded: Any) -> dict[str, Any]:
    return {"model": model_path, "device": loaded.device, "precision": loaded.precision,
            "backend": type(loaded.backend).__name__}


def _turns(args: argparse.Namespace, show) -> dict[str, Any]:
    from engine.bench import measure as measure
    from engine.host.cpu_threads import apply_engine_threads

    apply_engine_threads()
    loaded = _open(args.model, "auto", "auto")
    rows = []
    for row in measure.run_turns(loaded, args.turns, args.reply_tokens, args.repeats):
        show(row)
        rows.append(row)
    return {
        "model": args.model, "backend": type(loaded.backend).__name__, "turns": len(rows),
        "ttft_ratio_last_first": round(rows[-1]["ttft_ms_reuse"] / rows[0]["ttft_ms_reuse"], 3),
        "all_same_text": all(row["same_text"] for row in rows),
    }


def _load(args: argparse.Namespace, show) -> dict[str, Any]:
    from engine.host.memory import read_memory

    for cycle in range(1, args.cycles + 1):
        loaded = None  # the previous cycle's model goes before the next one loads
        gc.collect()
        started = time.perf_counter()
        loaded = _open(args.model, "auto", "auto")
        load_s = time.perf_counter() - started
        if args.cycles > 1:
            memory = read_memory(loaded.device, loaded.weight_bytes, 0, 0)
            show({"cycle": cycle, "load_s": round(load_s, 3), "device_used_bytes": memory.device_used_bytes,
                  "process_rss_bytes": memory.process_rss_bytes})
    return {"load_s": round(load_s, 3), "weight_bytes": loaded.weight_bytes, "precision": loaded.precision}


COMMANDS = {
    "decode": _decode, "prefill": _prefill, "chat": _chat, "turns": _turns, "load": _load, "remote": remote_client.run,
}
