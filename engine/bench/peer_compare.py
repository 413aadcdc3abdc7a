"""Hearth's engine and llama.cpp on the same GGUF file, taking turns (main thread of a benchmark).

Both get the same token ids and the same number of threads (``engine_threads``);
llama.cpp runs in its own process (``peer``) and waits while Hearth runs, and the
other way round, so each round sees the same machine load. Summaries are medians.
``ratio`` is Hearth's rate over llama.cpp's (above 1: Hearth is faster).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from engine.bench import measure
from engine.bench.bench_models import gguf_file
from engine.bench.peer import PeerProcess, batched_decode_tok_s
from engine.models.loading import LoadedModel

Show = Callable[[dict[str, Any]], None]
WARMUP_TOKENS = 4


def decode_rounds(loaded: LoadedModel, model: str, prompt: list[int], new_tokens: int, rounds: int,
                  threads: int, show: Show) -> dict[str, Any]:
    """Greedy decode of ``new_tokens`` after ``prompt``, ``rounds`` times each, Hearth first in every round."""
    hearth, peer_rates, same = [], [], []
    with PeerProcess(gguf_file(model), threads, n_ctx=len(prompt) + new_tokens + 8) as peer:
        peer.decode(prompt[:8], WARMUP_TOKENS)
        for index in range(1, rounds + 1):
            ours = measure.measure_engine_decode(loaded, prompt, new_tokens)
            theirs = peer.decode(prompt, new_tokens)
            hearth.append(ours.decode_tok_s)
            peer_rates.append(theirs["decode_tok_s"])
            same.append(ours.text == loaded.tokenizer.decode(theirs["tokens"], skip_special_tokens=True))
            show({"round": index, "engine_decode_tok_s": round(ours.decode_tok_s, 2),
                  "llama_cpp_decode_tok_s": round(theirs["decode_tok_s"], 2)})
    return _summary("decode_tok_s", hearth, peer_rates, threads) | {"same_text_as_llama_cpp": all(same)}


def prefill_rounds(loaded: LoadedModel, model: str, prompt: list[int], rounds: int, threads: int,
                   show: Show) -> dict[str, Any]:
    """Prefill of ``prompt`` into an empty cache, ``rounds`` times each (after one warm-up each)."""
    hearth, peer_rates = [], []
    with PeerProcess(gguf_file(model), threads, n_ctx=len(prompt) + 8) as peer:
        measure.measure_prefill_ms(loaded, prompt, 1)
        peer.prefill_ms(prompt)
        for index in range(1, rounds + 1):
            ours_ms = measure.measure_prefill_ms(loaded, prompt, 1)[0]
            theirs_ms = peer.prefill_ms(prompt)
            hearth.append(len(prompt) / (ours_ms / 1000))
            peer_rates.append(len(prompt) / (theirs_ms / 1000))
            show({"round": index, "engine_prefill_tok_s": round(hearth[-1], 1),
                  "llama_cpp_prefill_tok_s": round(peer_rates[-1], 1)})
    return _summary("prefill_tok_s", hearth, peer_rates, threads)


def _summary(figure: str, hearth: list[float], peer_rates: list[float], threads: int) -> dict[str, Any]:
    ours, theirs = statistics.median(hearth), statistics.median(peer_rates)
    return {"rounds": len(hearth), "threads": threads, f"engine_{figure}": round(ours, 2),
            f"llama_cpp_{figure}": round(theirs, 2), "ratio": round(ours / theirs, 3) if theirs else None}


def batched_rates(model: str, sequences: list[int], prompt_tokens: int, new_tokens: int, threads: int,
                  prompts: list[list[int]] | None = None) -> dict[str, Any]:
    """llama.cpp's aggregate decode rate for each N of ``sequences`` (see ``peer.batched_decode_tok_s``), sequence
    i from ``prompts[i]`` (Hearth's own requests', where it runs them beside), else from ``distinct_prompts``."""
    prompts = prompts or distinct_prompts(max(sequences), prompt_tokens)
    rates = batched_decode_tok_s(gguf_file(model), prompts, sequences, new_tokens, threads)
    return {"model": model, "threads": threads, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "llama_cpp_tok_s": {str(n): round(rate, 2) for n, rate in rates.items()}}


def distinct_prompts(count: int, prompt_tokens: int) -> list[list[int]]:
    """``count`` prompts of ``prompt_tokens`` token ids that differ from their first token on."""
    return [[1 + (index + position) % prompt_tokens for position in range(prompt_tokens)] for index in range(count)]
