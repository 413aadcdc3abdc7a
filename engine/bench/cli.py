"""``python -m engine.bench``: decode speed, multi-turn reuse and load time, as JSON lines (main thread).

    decode --model default|PATH|random:NAME|random-gguf:SHAPE[@LAYERS]:TYPE --device auto|cpu|cuda
           --quant none|int8|int4|auto --prompt-tokens N --new-tokens N
           [--baseline [transformers|llama.cpp]] [--rounds N]
    prefill --model … --device … --quant … --prompt-tokens 4096 [--repeats N] [--baseline llama.cpp]
    chat   --model … --device … --quant … --context-tokens 4096 --new-tokens 50 [--repeats N]
    turns  --model default --turns 20 [--repeats N]
    load   --model PATH|random-hf:SHAPE:DTYPE|… [--quant auto|fp16|int4|…] [--cycles N] [--loads N]
           [--memory-limit-gb G]
    batched --model GGUF --sequences 1 8 16 [--prompt-tokens N] [--new-tokens N]
    serve  --model … --concurrency 1,2,4,8,16 [--prompt-tokens N] [--new-tokens N] [--shared-prefix N] [--rounds N]
           [--constrained-half] [--join [--join-tokens N] [--step-tokens N]]
    serve-api --model default|PATH --new-tokens N [--rounds N] [--clients N]   (``serve_api``: what the API server adds)
    speculative --model default|PATH|random-gguf:… [--draft-model …] [--new-tokens N] [--rounds N]
    remote --url URL --model ID [--api-key KEY] [--new-tokens N] [--rounds N]

``decode``, ``prefill``, ``chat`` and ``turns`` time replies through the batch runner
(``runner_replies``), a single reply as a batch of one, as the window and the server
run them (``"path": "batch"``). One JSON object per line on stdout (``--json``; without
it, ``key=value`` lines);
the last line is the summary. Baselines run in the same run, taking turns with
the engine, so both see the same machine load; the summary gives medians. The
transformers baseline runs in the same process; llama.cpp (``peer``) in its own,
with as many threads as the engine. ``load`` runs each load in a fresh process
and reads its memory and disk writes from the OS; ``batched`` is llama.cpp's
aggregate decode rate with N sequences in one context. A failure prints
``{"ok": false, "error": …}`` as the last line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Callable

from engine.bench import remote_client
from engine.bench.serve_api import add_parser as add_serve_api_parser
from engine.bench.serve_api import run as run_serve_api
from engine.bench.speculative import add_parser as add_speculative_parser
from engine.bench.speculative import run as run_speculative
from engine.protocol.messages import DEVICES, PRECISIONS

WARMUP_TOKENS = 4
BASELINES = ("transformers", "llama.cpp")
QUANTS = ("none", *PRECISIONS)  # none: the device's full precision


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    show = _printer(args.json)
    try:
        import torch

        from engine.host.allocator import set_up_process_memory

        torch.set_grad_enabled(False)
        set_up_process_memory()  # as the app's engine does
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
    decode.add_argument("--device", default="auto", choices=DEVICES)
    decode.add_argument("--quant", default="auto", choices=QUANTS)
    decode.add_argument("--prompt-tokens", type=int, default=128)
    decode.add_argument("--new-tokens", type=int, default=128)
    decode.add_argument("--baseline", nargs="?", const="transformers", choices=BASELINES,
                        help="also time plain model.generate() (the default) or llama.cpp on the same GGUF file")
    decode.add_argument("--rounds", type=int, default=3, help="engine and baseline runs, taking turns")
    prefill = commands.add_parser("prefill", help="time to feed a long prompt into an empty cache")
    prefill.add_argument("--prompt-tokens", type=int, default=4096)
    prefill.add_argument("--baseline", choices=("llama.cpp",), help="also time llama.cpp on the same GGUF file")
    chat = commands.add_parser("chat", help="time to first token of a new message after a long cached chat")
    chat.add_argument("--context-tokens", type=int, default=4096)
    chat.add_argument("--new-tokens", type=int, default=50)
    for command in (prefill, chat):
        command.add_argument("--device", default="auto", choices=DEVICES)
        command.add_argument("--quant", default="auto", choices=QUANTS)
        command.add_argument("--repeats", type=int, default=5)
    turns = commands.add_parser("turns", help="time to first token over a long conversation, reused vs fresh cache")
    turns.add_argument("--turns", type=int, default=20)
    turns.add_argument("--reply-tokens", type=int, default=48)
    turns.add_argument("--repeats", type=int, default=3, help="reused times to first token per turn (median)")
    load = commands.add_parser("load", help="load time and weight size")
    load.add_argument("--cycles", type=int, default=1, help="load and unload this many times, reporting memory")
    load.add_argument("--loads", type=int, default=1, help="fresh processes, each loading once (with llama.cpp's)")
    load.add_argument("--memory-limit-gb", type=float, help="address-space limit of each load process")
    load.add_argument("--quant", default="auto", choices=QUANTS,
                      help="the precision to load in (none: the device's full precision)")
    load.add_argument("--device", default="auto", choices=DEVICES)
    batched = commands.add_parser("batched", help="llama.cpp's aggregate decode rate, N sequences in one context")
    batched.add_argument("--sequences", type=int, nargs="+", default=[1, 8, 16])
    batched.add_argument("--prompt-tokens", type=int, default=128)
    batched.add_argument("--new-tokens", type=int, default=32)
    serve = commands.add_parser("serve", help="continuous batching: many requests at once (a fast path's batch runner)")
    serve.add_argument("--device", default="cpu", choices=DEVICES)
    serve.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated numbers of requests at once")
    serve.add_argument("--prompt-tokens", type=int, default=128)
    serve.add_argument("--new-tokens", type=int, default=64)
    serve.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    serve.add_argument("--rounds", type=int, default=1,
                       help="runs of every level (taking turns with llama.cpp) and of the join, reported by medians")
    serve.add_argument("--constrained-half", action="store_true",
                       help="every other request decodes under a JSON schema (constrained and free in one batch)")
    serve.add_argument("--join", action="store_true", help="a request arriving while 7 others stream")
    serve.add_argument("--join-tokens", type=int, default=2000, help="the arriving request's prompt tokens")
    serve.add_argument("--step-tokens", type=int, default=None, help="the joining test's tokens per step (scheduler's default)")
    serve_api = add_serve_api_parser(commands)
    speculative = add_speculative_parser(commands)
    for command in (decode, prefill, chat, turns, load, batched, serve, serve_api, speculative):
        command.add_argument("--model", default="default")
        command.add_argument("--json", action="store_true", help="JSON lines (else key=value lines)")
    remote_client.add_arguments(commands.add_parser("remote", help="Hearth's remote client vs a bare one, on a server"))
    return parser


def _printer(as_json: bool):
    def show(record: dict[str, Any]) -> None:
        line = json.dumps(record) if as_json else "  ".join(f"{k}={v}" for k, v in record.items())
        print(line, flush=True)

    return show


def _open(model: str, device: str, quant: str) -> Any:
    """``bench_models.open_bench_model``, imported when a command runs (after torch, inside ``main``'s guard)."""
    from engine.bench.bench_models import open_bench_model

    return open_bench_model(model, device, quant)


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
    kv_bytes = first.kv_bytes
    bandwidth = measure.copy_bandwidth(device)
    decode_bytes = getattr(loaded.model, "decode_bytes", loaded.weight_bytes)  # transformers models: all weights
    summary = {
        **_described(args.model, loaded), "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
        "weight_bytes": loaded.weight_bytes, "decode_bytes": decode_bytes, "copy_bandwidth_bytes_s": round(bandwidth),
        "bandwidth_limit_tok_s": round(bandwidth / decode_bytes, 1),  # each weight read once per token
        "peak_memory_bytes": engine_peak, "engine_threads": threads["engine"], "kv_cache_bytes": kv_bytes,
        "peak_over_weights_kv": round(engine_peak / (loaded.weight_bytes + kv_bytes), 3) if device.type == "cuda" else None,
        "notices": list(loaded.notices),
    }
    if args.baseline == "llama.cpp":
        from engine.bench.peer_compare import decode_rounds

        return summary | decode_rounds(loaded, args.model, prompt, args.new_tokens, args.rounds, threads["engine"], show)
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
    engine = _median_run(engine_runs, lambda run: run.decode_tok_s)
    found = {"rounds": args.rounds, "engine_decode_tok_s": round(engine.decode_tok_s, 2),
             "engine_ttft_ms": round(engine.ttft_ms, 1)}
    if not hf_runs:
        return found
    hf = _median_run(hf_runs, lambda run: run.decode_tok_s)
    return found | {
        "hf_decode_tok_s": round(hf.decode_tok_s, 2), "hf_ttft_ms": round(hf.ttft_ms, 1), "hf_threads": threads["hf"],
        "speedup": round(engine.decode_tok_s / hf.decode_tok_s, 2) if hf.decode_tok_s else None,
        "same_text_as_hf": all(run.text == hf_runs[0].text for run in engine_runs + hf_runs),
    }


def _median_run(runs: list[Any], figure: Callable[[Any], float]) -> Any:
    """The run whose ``figure`` is the median (the upper of the middle two for an even count)."""
    return sorted(runs, key=figure)[len(runs) // 2]


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
    source = Path(folder)
    if source.suffix.lower() == ".gguf":  # transformers dequantizes the file itself
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=dtype)
        return model.to(device).eval()
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def _prefill(args: argparse.Namespace, show) -> dict[str, Any]:
    """Median time to prefill ``--prompt-tokens`` tokens from an empty cache (after one warm-up run); with
    ``--baseline llama.cpp``, both engines take ``--repeats`` turns."""
    from engine.bench import measure as measure
    from engine.host.cpu_threads import apply_engine_threads

    threads = apply_engine_threads()
    loaded = _open(args.model, args.device, args.quant)
    prompt = measure.filler_prompt(loaded.tokenize, args.prompt_tokens)
    if args.baseline == "llama.cpp":
        from engine.bench.peer_compare import prefill_rounds

        described = {**_described(args.model, loaded), "prompt_tokens": len(prompt)}
        return described | prefill_rounds(loaded, args.model, prompt, args.repeats, threads, show)
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
    from engine.forward.native.build import kernels_variant

    return {"model": model_path, "device": loaded.device, "precision": loaded.precision,
            "backend": type(loaded.backend).__name__, "path": "batch", "kernels": kernels_variant(loaded.device)}


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
        "model": args.model, "backend": type(loaded.backend).__name__, "path": "batch", "turns": len(rows),
        "ttft_ratio_last_first": round(rows[-1]["ttft_ms_reuse"] / rows[0]["ttft_ms_reuse"], 3),
        "all_same_text": all(row["same_text"] for row in rows),
    }


def _load(args: argparse.Namespace, show) -> dict[str, Any]:
    """``--loads`` fresh processes, each loading once (``load_probe``), each followed by llama.cpp's own load of
    the same file when the peer is set up and the model is a GGUF file; medians of both."""
    import statistics

    from engine.bench.bench_models import resolve_model
    from engine.bench.load_probe import PROBE_IDS, run_load_probe

    model = resolve_model(args.model)
    limit = int(args.memory_limit_gb * 1024**3) if args.memory_limit_gb else None
    peer_file = _peer_file(args.model)
    hearth, peer = [], []
    for index in range(1, args.loads + 1):
        hearth.append(run_load_probe(model, args.quant, args.cycles, limit, show, args.device))
        peer.append(_peer_load(peer_file, PROBE_IDS) if peer_file else {})
        show({"load": index, **hearth[-1], **{f"llama_cpp_{key}": value for key, value in peer[-1].items()}})
    done = [figures for figures in hearth if "error" not in figures]
    if not done and not peer[0]:
        raise RuntimeError(hearth[-1]["error"])
    summary = {"model": args.model, "quant": args.quant, "device": args.device, "loads": args.loads,
               "memory_limit_bytes": limit}
    if done:
        summary |= {**done[-1], **{key: statistics.median(f[key] for f in done) for key in _LOAD_MEDIANS},
                    "disk_bytes_written_first": hearth[0].get("disk_bytes_written")}
    else:
        summary["error"] = hearth[-1]["error"]
    if peer[0]:
        summary |= {f"llama_cpp_{key}": statistics.median(p[key] for p in peer) for key in peer[0]}
    return summary


_LOAD_MEDIANS = ("load_s", "rss_after_load_bytes", "peak_rss_bytes", "peak_rss_after_prompt_bytes", "disk_bytes_written")


def _peer_file(model: str) -> Any:
    from engine.bench.bench_models import gguf_file
    from engine.bench.peer import peer_python

    try:
        return gguf_file(model) if peer_python() else None
    except ValueError:
        return None  # not a GGUF file: Hearth's figures alone


def _peer_load(path: Any, probe: list[int]) -> dict[str, Any]:
    from engine.bench.peer import peer_load
    from engine.host.cpu_threads import engine_threads

    return peer_load(path, engine_threads(), probe)


def _batched(args: argparse.Namespace, show, prompts: list[list[int]] | None = None) -> dict[str, Any]:
    from engine.bench.peer_compare import batched_rates
    from engine.host.cpu_threads import engine_threads

    return batched_rates(args.model, args.sequences, args.prompt_tokens, args.new_tokens, engine_threads(), prompts)


def _peer_batched_rates(args: argparse.Namespace, levels: list[int], prompts: list[list[int]]) -> dict[str, float]:
    """llama.cpp's aggregate decode rate per level on the same file, its sequences from Hearth's requests'
    ``prompts`` ({} without the peer or a GGUF file)."""
    if _peer_file(args.model) is None:
        return {}
    return _batched(argparse.Namespace(model=args.model, sequences=levels, prompt_tokens=args.prompt_tokens,
                                       new_tokens=args.new_tokens), None, prompts)["llama_cpp_tok_s"]


def _median_level(runs: list[dict[str, Any]], peer_rates: list[float]) -> dict[str, Any]:
    """One level's line: the run of median steady decode rate, and over rounds its steady rates and llama.cpp's,
    compared by their medians."""
    row = dict(_median_run(runs, lambda run: run["steady_decode_tok_s"]))
    if len(runs) > 1:
        row |= {"rounds": len(runs), "steady_decode_tok_s_rounds": [run["steady_decode_tok_s"] for run in runs]}
    if peer_rates:
        rate = statistics.median(peer_rates)
        row |= {"llama_cpp_aggregate_decode_tok_s": round(rate, 2),
                "aggregate_over_llama_cpp": round(row["aggregate_decode_tok_s"] / rate, 2),
                "steady_over_llama_cpp": round(row["steady_decode_tok_s"] / rate, 2)}
        if len(peer_rates) > 1:
            row["llama_cpp_rounds"] = peer_rates
    return row


def _median_join(joins: list[dict[str, Any]]) -> dict[str, Any]:
    """The joining test's line: the run of median first-token ratio, with over rounds each ratio's values and median."""
    row = dict(_median_run(joins, lambda run: run["join_ttft_ratio"]))
    if len(joins) > 1:
        for key in ("join_ttft_ratio", "itl_p99_over_p50"):
            values = [run[key] for run in joins]
            row |= {f"{key}_rounds": values, f"{key}_median": statistics.median(values)}
    return row


def _serve(args: argparse.Namespace, show) -> dict[str, Any]:
    from engine.bench import serve as serve
    from engine.forward.backend import HFBackend
    from engine.host.cpu_threads import apply_engine_threads

    apply_engine_threads()
    loaded = _open(args.model, args.device, "auto")
    if isinstance(loaded.backend, HFBackend):
        raise ValueError(f"{type(loaded.backend).__name__} runs one request at a time: serve needs a fast path.")
    serve.run_level(loaded, 2, 16, 4, 0)  # warm-up
    levels = [int(level) for level in args.concurrency.split(",") if level.strip()]
    runs: dict[int, list[dict[str, Any]]] = {level: [] for level in levels}
    peer_runs: dict[int, list[float]] = {level: [] for level in levels}
    prompts = serve.prompts_for(loaded, max(levels), args.prompt_tokens, args.shared_prefix)  # llama.cpp's too
    for _ in range(max(args.rounds, 1)):  # llama.cpp and the engine take turns, so both see the same machine load
        for level, rate in _peer_batched_rates(args, levels, prompts).items():
            peer_runs[int(level)].append(rate)
        for level in levels:
            runs[level].append(serve.run_level(loaded, level, args.prompt_tokens, args.new_tokens, args.shared_prefix,
                                               args.constrained_half))
    rows = [_median_level(runs[level], peer_runs[level]) for level in levels]
    for row in rows:
        show(row)
    summary = {**_described(args.model, loaded), "levels": levels}
    if rows and rows[0]["concurrency"] == 1:
        single = rows[0]["aggregate_decode_tok_s"]
        summary["aggregate_over_single"] = {row["concurrency"]: round(row["aggregate_decode_tok_s"] / single, 2) for row in rows}
    summary["aggregate_decode_tok_s"] = {row["concurrency"]: row["aggregate_decode_tok_s"] for row in rows}
    if args.join:
        step_tokens = args.step_tokens or serve.DEFAULT_STEP_TOKENS
        joins = [serve.run_join(loaded, args.prompt_tokens, args.join_tokens, step_tokens) for _ in range(max(args.rounds, 1))]
        joined = _median_join(joins)
        show(joined)
        summary |= {k: v for k, v in joined.items() if k != "join"}
    return summary


COMMANDS = {"decode": _decode, "prefill": _prefill, "chat": _chat, "turns": _turns, "load": _load,
            "batched": _batched, "serve": _serve, "serve-api": run_serve_api, "speculative": run_speculative,
            "remote": remote_client.run}
