"""llama.cpp, driven over JSON lines: the script the peer's own interpreter runs (main thread of that process).

``<peer python> engine/bench/peer_llama.py`` reads one request a line on stdin and
answers each with one JSON line on stdout. It needs only ``llama_cpp`` and numpy,
so it imports nothing of Hearth's (Hearth's venv never has ``llama_cpp``; the
import sits inside ``Peer.load`` so that importing this module there is harmless).

Requests (``op`` and its fields), each answered with ``ok`` and its figures:

- ``load`` ``model, n_ctx, threads``: ``load_s``, ``peak_rss_bytes`` (VmHWM).
- ``decode`` ``prompt, new_tokens``: greedy, end-of-sequence ignored: ``prefill_ms``,
  ``decode_tok_s`` over the steps after the first token, ``tokens``.
- ``rss``: ``peak_rss_bytes`` now.
- ``prefill`` ``prompt``: ``prefill_ms`` from an empty cache.
- ``logits`` ``ids, out, chunk``: every position's logits (``logits_all``) saved as
  float32 ``[len(ids), vocab]`` to the ``.npy`` file ``out``; ``ids`` go in
  ``llama_decode`` calls of ``chunk`` tokens (1: token by token, as replies are made).
- ``batched`` ``prompts, sequences, new_tokens``: for each N, one context holding N
  sequences (sequence i prefilled with ``prompts[i % len(prompts)]``, so N
  conversations that differ route a mixture of experts' rows as N users would),
  then ``new_tokens`` steps that each decode one token of every sequence in one
  ``llama_decode``, as llama-server's slots do: ``tok_s`` (all sequences' tokens
  per second) per N.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import numpy as np

CHUNK = 512  # tokens per llama_decode while prefilling (llama.cpp's default n_batch)


class Peer:
    """One model and its single-sequence context; each public method answers one ``op``."""

    def __init__(self) -> None:
        self.llama: Any = None
        self.model: Any = None
        self.ctx: Any = None
        self.threads = 1
        self.n_ctx = 0

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        import llama_cpp
        from llama_cpp import _internals as internals

        self.llama = llama_cpp
        self.threads, self.n_ctx = request["threads"], request["n_ctx"]
        started = time.perf_counter()
        params = self.llama.llama_model_default_params()
        self.model = internals.LlamaModel(path_model=request["model"], params=params, verbose=False)
        self.ctx = self._context(request["n_ctx"], 1)
        return {"load_s": time.perf_counter() - started, "peak_rss_bytes": peak_rss_bytes(),
                "vocab": self.model.n_vocab()}

    def rss(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"peak_rss_bytes": peak_rss_bytes()}

    def _context(self, n_ctx: int, sequences: int) -> Any:
        from llama_cpp import _internals as internals

        params = self.llama.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, CHUNK, CHUNK
        params.n_seq_max, params.kv_unified = sequences, True
        params.n_threads = params.n_threads_batch = self.threads
        return internals.LlamaContext(model=self.model, params=params, verbose=False)

    def _check(self, ids: list[int], extra: int = 0) -> None:
        """llama.cpp aborts the process on a context overflow or a token it lacks: refuse those first."""
        if len(ids) + extra > self.n_ctx:
            raise ValueError(f"{len(ids) + extra} tokens do not fit the {self.n_ctx}-token context")
        vocab = self.model.n_vocab()
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"token ids must be 0…{vocab - 1}, and at least one")

    def decode(self, request: dict[str, Any]) -> dict[str, Any]:
        self._check(request["prompt"], request["new_tokens"])
        self.ctx.kv_cache_clear()
        started = time.perf_counter()
        logits = self._feed(self.ctx, request["prompt"], 0, all_logits=False)
        tokens = [int(np.argmax(logits[-1]))]
        first = time.perf_counter()
        position = len(request["prompt"])
        for _ in range(request["new_tokens"] - 1):
            tokens.append(int(np.argmax(self._feed(self.ctx, tokens[-1:], position, all_logits=False)[-1])))
            position += 1
        spent = time.perf_counter() - first
        steps = max(len(tokens) - 1, 1)
        return {"prefill_ms": (first - started) * 1000, "decode_tok_s": steps / spent if spent > 0 else 0.0,
                "tokens": tokens}

    def prefill(self, request: dict[str, Any]) -> dict[str, Any]:
        self._check(request["prompt"])
        self.ctx.kv_cache_clear()
        started = time.perf_counter()
        self._feed(self.ctx, request["prompt"], 0, all_logits=False)
        return {"prefill_ms": (time.perf_counter() - started) * 1000}

    def logits(self, request: dict[str, Any]) -> dict[str, Any]:
        self._check(request["ids"])
        self.ctx.kv_cache_clear()
        np.save(request["out"], self._feed(self.ctx, request["ids"], 0, all_logits=True, chunk=request.get("chunk", CHUNK)))
        return {"positions": len(request["ids"])}

    def _feed(self, ctx: Any, ids: list[int], start: int, all_logits: bool, chunk: int = CHUNK,
              seq: int = 0) -> np.ndarray:
        """Decode ``ids`` of sequence ``seq`` from ``start``, ``chunk`` tokens a call: logits ``[len(ids) or 1,
        vocab]``."""
        from llama_cpp import _internals as internals

        rows = []
        batch = internals.LlamaBatch(n_tokens=CHUNK, embd=0, n_seq_max=1, verbose=False)
        for offset in range(0, len(ids), chunk):
            part = ids[offset:offset + chunk]
            batch.set_batch(part, start + offset, all_logits)
            for i in range(len(part)):
                batch.batch.seq_id[i][0] = seq
            ctx.decode(batch)
            wanted = len(part) if all_logits else 1
            base = len(part) - wanted
            rows += [np.ctypeslib.as_array(ctx.get_logits_ith(base + i), shape=(self.model.n_vocab(),)).copy()
                     for i in range(wanted)]
        batch.close()
        return np.stack(rows)  # [positions, vocab]

    def batched(self, request: dict[str, Any]) -> dict[str, Any]:
        prompts = request["prompts"]
        for prompt in prompts:
            self._check(prompt)
        return {"tok_s": {str(n): self._batched_rate(prompts, n, request["new_tokens"])
                          for n in request["sequences"]}}

    def _batched_rate(self, prompts: list[list[int]], sequences: int, new_tokens: int) -> float:
        from llama_cpp import _internals as internals

        own = [prompts[seq % len(prompts)] for seq in range(sequences)]
        ctx = self._context(sequences * (max(map(len, own)) + new_tokens + 1), sequences)
        last = [int(np.argmax(self._feed(ctx, prompt, 0, all_logits=False, seq=seq)[-1]))
                for seq, prompt in enumerate(own)]
        batch = internals.LlamaBatch(n_tokens=sequences, embd=0, n_seq_max=1, verbose=False)
        started = time.perf_counter()
        for step in range(new_tokens):
            _fill_step(batch.batch, last, [len(prompt) + step for prompt in own])
            ctx.decode(batch)
            last = [int(np.argmax(np.ctypeslib.as_array(ctx.get_logits_ith(i), shape=(self.model.n_vocab(),))))
                    for i in range(sequences)]
        spent = time.perf_counter() - started
        batch.close()
        ctx.close()
        return sequences * new_tokens / spent


def _fill_step(batch: Any, tokens: list[int], positions: list[int]) -> None:
    """One token for each sequence ``i`` (``seq_id`` i) at ``positions[i]``, every one wanting its logits."""
    batch.n_tokens = len(tokens)
    for i, (token, position) in enumerate(zip(tokens, positions)):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, 1, True
        batch.seq_id[i][0] = i


def peak_rss_bytes() -> int:
    """The process's peak resident size from the OS (VmHWM; ``ru_maxrss`` where /proc is missing)."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def serve() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever llama.cpp prints goes to stderr, never among the answers
    peer = Peer()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"ok": True, **getattr(peer, request["op"])(request)}
        except Exception as exc:  # every failure goes back as data; the caller decides
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
