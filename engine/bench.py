"""``python -m engine.bench``: decode speed, multi-turn reuse and load time, as JSON lines (main thread).

    decode --model default|PATH|random:NAME --device auto|cpu|cuda --quant none|int8|nf4|auto
           --prompt-tokens N --new-tokens N [--baseline]
    prefill --model … --device … --quant … --prompt-tokens 4096 [--repeats N]
    chat   --model … --device … --quant … --context-tokens 4096 --new-tokens 50 [--repeats N]
    turns  --model default --turns 20
    load   --model PATH [--cycles N]

One JSON object per line on stdout (``--json``; without it, ``key=value`` lines);
the last line is the summary. Baselines run in the same process, right after the
engine, so both see the same machine load. A failure prints
``{"ok": false, "error": …}`` as the last line and exits with status 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from engine.messages import LoadOptions

QUANT_PRECISION = {"int8": "int8", "nf4": "nf4", "auto": "auto"}
WARMUP_TOKENS = 4


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    show = _printer(args.json)
    try:
        import torch

        torch.set_grad_enabled(False)
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
    load = commands.add_parser("load", help="load time and weight size")
    load.add_argument("--cycles", type=int, default=1, help="load and unload this many times, reporting memory")
    for command in (decode, prefill, chat, turns, load):
        command.add_argument("--model", default="default")
        command.add_argument("--json", action="store_true", help="JSON lines (else key=value lines)")
    return parser


def _printer(as_json: bool):
    def show(record: dict[str, Any]) -> None:
        line = json.dumps(record) if as_json else "  ".join(f"{k}={v}" for k, v in record.items())
        print(line, flush=True)

    return show


def _open(path: str, device: str, quant: str) -> Any:
    """The model as the engine loads it: same precision choice, same backend."""
    from engine.loading import resolve_device
    from engine.model_open import open_model
    from engine.random_models import is_random, load_random

    chosen = resolve_device(device)
    precision = QUANT_PRECISION.get(quant) or ("bf16" if chosen.type == "cuda" else "fp32")
    if is_random(path):
        return load_random(path, chosen.type, precision)
    return open_model(path, LoadOptions(chosen.type, precision), lambda _: None, lambda *_: None, lambda: False)


def _decode(args: argparse.Namespace, show) -> dict[str, Any]:
    import torch

    from engine import bench_measure as measure
    from engine.cpu_threads import apply_engine_threads

    torch_default_threads = torch.get_num_threads()
    engine_threads = apply_engine_threads()
    loaded = _open(args.model, args.device, args.quant)
    device = torch.device(loaded.device)
    prompt = measure.filler_prompt(loaded.tokenize, args.prompt_tokens)
    measure.reset_peak_memory(device)
    measure.measure_engine_decode(loaded, prompt[:8], WARMUP_TOKENS)
    engine = measure.measure_engine_decode(loaded, prompt, args.new_tokens)
    engine_peak = measure.peak_memory_bytes(device)
    kv_bytes = measure.cache_bytes_for(loaded, prompt)
    bandwidth = measure.copy_bandwidth(device)
    summary = {
        "model": args.model, "device": loaded.device, "precision": loaded.precision,
        "backend": type(loaded.backend).__name__, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
        "engine_decode_tok_s": round(engine.decode_tok_s, 2), "engine_ttft_ms": round(engine.ttft_ms, 1),
        "weight_bytes": loaded.weight_bytes, "copy_bandwidth_bytes_s": round(bandwidth),
        "bandwidth_limit_tok_s": round(bandwidth / loaded.weight_bytes, 1),  # each weight read once per token
        "peak_memory_bytes": measure.peak_memory_bytes(device), "engine_threads": engine_threads,
        "engine_peak_memory_bytes": engine_peak, "kv_cache_bytes": kv_bytes,
        "peak_over_weights_kv": round(engine_peak / (loaded.weight_bytes + kv_bytes), 3) if device.type == "cuda" else None,
        "notices": list(loaded.notices),
    }
    if args.baseline:  # plain generate() as a user would run it: torch's own thread count
        torch.set_num_threads(torch_default_threads)
        summary |= _baseline(args.model, loaded, prompt, args.new_tokens, engine) | {"hf_threads": torch_default_threads}
    return summary


def _baseline(model_path: str, loaded: Any, prompt: list[int], new_tokens: int, engine: Any) -> dict[str, Any]:
    """Plain ``generate()`` on a transformers copy: fp32 on the CPU, the engine's dtype on a GPU."""
    import torch

    from engine import bench_measure as measure

    device = torch.device(loaded.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = _hf_model(model_path, loaded.path, device, dtype)
    measure.measure_hf_generate(model, loaded.tokenizer, prompt[:8], WARMUP_TOKENS)
    hf = measure.measure_hf_generate(model, loaded.tokenizer, prompt, new_tokens)
    return {
        "hf_decode_tok_s": round(hf.decode_tok_s, 2), "hf_ttft_ms": round(hf.ttft_ms, 1),
        "speedup": round(engine.decode_tok_s / hf.decode_tok_s, 2) if hf.decode_tok_s else None,
        "same_text_as_hf": engine.text == hf.text,
    }


def _hf_model(model_path: str, folder: str, device: Any, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    from engine.random_models import PREFIX, build_hf_model, is_random

    if is_random(model_path):
        return build_hf_model(model_path[len(PREFIX):], device, dtype)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def _prefill(args: argparse.Namespace, show) -> dict[str, Any]:
    """Median time to prefill ``--prompt-tokens`` tokens from an empty cache (after one warm-up run)."""
    from engine import bench_measure as measure

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
    from engine import bench_measure as measure

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
    from engine import bench_measure as measure
    from engine.cpu_threads import apply_engine_threads

    apply_engine_threads()
    loaded = _open(args.model, "auto", "auto")
    rows = []
    for row in measure.run_turns(loaded, args.turns, args.reply_tokens):
        show(row)
        rows.append(row)
    return {
        "model": args.model, "backend": type(loaded.backend).__name__, "turns": len(rows),
        "ttft_ratio_last_first": round(rows[-1]["ttft_ms_reuse"] / rows[0]["ttft_ms_reuse"], 3),
        "all_same_text": all(row["same_text"] for row in rows),
    }


def _load(args: argparse.Namespace, show) -> dict[str, Any]:
    from engine.memory import read_memory

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


COMMANDS = {"decode": _decode, "prefill": _prefill, "chat": _chat, "turns": _turns, "load": _load}

if __name__ == "__main__":
    sys.exit(main())
