"""llama.cpp, the yardstick, in a subprocess of its own interpreter (main thread of a benchmark, or a test).

llama.cpp is never a dependency of Hearth: it lives in the git-ignored venv
``<repo>/.peer`` (or wherever ``$HEARTH_PEER_PYTHON`` points), and Hearth's code
never imports ``llama_cpp``. ``PeerProcess`` runs ``peer_llama.py`` under that
interpreter and talks to it in JSON lines; the process keeps its model loaded, so
benchmarks can take turns with Hearth's engine.

Set it up once with ``python3 -m venv .peer && .peer/bin/pip install
"llama-cpp-python[server]==0.3.36"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engine.bench.peer_llama import CHUNK as PEER_CHUNK

PEER_ENV = "HEARTH_PEER_PYTHON"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("peer_llama.py")
SETUP = 'python3 -m venv .peer && .peer/bin/pip install "llama-cpp-python[server]==0.3.36"'


class PeerUnavailable(RuntimeError):
    """No llama.cpp interpreter was found; the message says how to set one up."""


class PeerError(RuntimeError):
    """llama.cpp refused a request or its process died; the message carries its own words."""


def peer_python() -> Path | None:
    """The interpreter that has ``llama_cpp``: ``$HEARTH_PEER_PYTHON``, else ``<repo>/.peer/bin/python``."""
    chosen = os.environ.get(PEER_ENV)
    candidate = Path(chosen).expanduser() if chosen else REPO / ".peer" / "bin" / "python"
    return candidate if candidate.is_file() else None


def require_peer() -> Path:
    found = peer_python()
    if found is None:
        raise PeerUnavailable(f"llama.cpp is not set up: set {PEER_ENV} to a Python with llama_cpp, or run `{SETUP}`"
                              f" in {REPO}.")
    return found


class PeerProcess:
    """One llama.cpp process holding ``model`` with an ``n_ctx``-token context and ``threads`` threads."""

    def __init__(self, model: str | Path, threads: int, n_ctx: int = 2048) -> None:
        self._log = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [str(require_peer()), str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)},  # OMP_WAIT_POLICY passes through
        )
        try:
            self.loaded = self.request("load", model=str(model), n_ctx=n_ctx, threads=threads)
        except PeerError:
            self.close()
            raise

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # the process is gone; the empty answer below says so
        line = self._process.stdout.readline()
        if not line:
            raise PeerError(f"llama.cpp exited during {op!r}: {self._log_tail()}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise PeerError(f"llama.cpp could not {op}: {answer['error']}")
        return answer

    def decode(self, prompt: Sequence[int], new_tokens: int) -> dict[str, Any]:
        """Greedy ``new_tokens`` after ``prompt``: ``prefill_ms``, ``decode_tok_s``, ``tokens``."""
        return self.request("decode", prompt=list(prompt), new_tokens=new_tokens)

    def prefill_ms(self, prompt: Sequence[int]) -> float:
        return self.request("prefill", prompt=list(prompt))["prefill_ms"]

    def logits(self, ids: Sequence[int], chunk: int = PEER_CHUNK) -> np.ndarray:
        """llama.cpp's logits at every position of ``ids`` (teacher-forced), fed ``chunk`` tokens a call (1: token by
        token): float32 ``[len(ids), vocab]``."""
        with tempfile.TemporaryDirectory(prefix="hearth-peer-") as folder:
            out = Path(folder) / "logits.npy"
            self.request("logits", ids=list(ids), out=str(out), chunk=chunk)
            return np.load(out)

    def batched_tok_s(self, prompts: Sequence[Sequence[int]], sequences: Sequence[int],
                      new_tokens: int) -> dict[int, float]:
        answer = self.request("batched", prompts=[list(prompt) for prompt in prompts], sequences=list(sequences),
                              new_tokens=new_tokens)
        return {int(n): rate for n, rate in answer["tok_s"].items()}

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-800:].strip() or "no message"

    def close(self) -> None:
        if self._process.poll() is None and self._process.stdin is not None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def batched_decode_tok_s(model: str | Path, prompts: Sequence[Sequence[int]], sequences: Sequence[int],
                         new_tokens: int = 32, threads: int = 2) -> dict[int, float]:
    """llama.cpp's aggregate decode rate (tokens per second, all sequences together) for each N in ``sequences``.

    One context holds N sequences, sequence i prefilled with ``prompts[i % len(prompts)]``; each of the
    ``new_tokens`` steps then decodes one token of every sequence in a single ``llama_decode``, as
    llama-server's slots share one context. Prompts that differ keep the sequences apart, as N users' are:
    identical ones would decode identical tokens, and a mixture of experts would read a single sequence's
    experts for all of them.
    """
    longest = max(map(len, prompts))
    with PeerProcess(model, threads, n_ctx=longest + 1) as peer:  # each N gets a context of its own
        return peer.batched_tok_s(prompts, sequences, new_tokens)


def peer_load(model: str | Path, threads: int, probe: Sequence[int]) -> dict[str, Any]:
    """llama.cpp's load in a fresh process: ``load_s`` and the process's ``peak_rss_bytes`` (VmHWM), also after
    the short prompt ``probe`` (``peak_rss_after_prompt_bytes``: with mmap, weights count once they are read)."""
    with PeerProcess(model, threads) as peer:
        peer.prefill_ms(probe)
        after = peer.request("rss")["peak_rss_bytes"]
        return {"load_s": round(peer.loaded["load_s"], 3), "peak_rss_bytes": peer.loaded["peak_rss_bytes"],
                "peak_rss_after_prompt_bytes": after}
