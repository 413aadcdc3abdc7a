"""llama.cpp as the benchmarks' peer: found or clearly missing, and (marked ``peer``) reading Hearth's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.bench import peer, random_gguf
from engine.bench.peer import PeerError, PeerProcess, PeerUnavailable, batched_decode_tok_s
from engine.bench.peer_compare import distinct_prompts

REPO = Path(__file__).resolve().parents[3]


def test_the_peer_is_whatever_hearth_peer_python_names(tmp_path, monkeypatch):
    interpreter = tmp_path / "python"
    interpreter.write_text("")
    monkeypatch.setenv(peer.PEER_ENV, str(interpreter))
    assert peer.peer_python() == interpreter

    monkeypatch.setenv(peer.PEER_ENV, str(tmp_path / "missing"))
    assert peer.peer_python() is None
    with pytest.raises(PeerUnavailable, match="llama-cpp-python"):
        peer.require_peer()


def test_a_llama_cpp_baseline_without_the_peer_fails_with_a_clear_message(tmp_path):
    env = {**os.environ, "HEARTH_HOME": str(tmp_path), peer.PEER_ENV: str(tmp_path / "missing")}
    done = subprocess.run([sys.executable, "-m", "engine.bench", "prefill", "--model", "random:tiny", "--device", "cpu",
                           "--prompt-tokens", "8", "--baseline", "llama.cpp", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)

    assert done.returncode == 2
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["ok"] is False and "GGUF file" in last["error"]
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.peer
def test_llama_cpp_loads_and_runs_a_random_q4_k_m_file(tmp_path, monkeypatch, default_model_path):
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    path = random_gguf.ensure_random_gguf("random-gguf:smollm2-135m:q4_k_m", default_model_path)

    with PeerProcess(path, threads=1, n_ctx=256) as llama:
        assert llama.loaded["vocab"] == 49152
        logits = llama.logits(list(range(1, 33)))  # [32, V]
        reply = llama.decode(list(range(1, 17)), 8)

    assert logits.shape == (32, 49152) and np.isfinite(logits).all()
    assert logits.std() > 0.1, "random weights give logits that differ from token to token"
    assert len(reply["tokens"]) == 8 and reply["decode_tok_s"] > 0


@pytest.mark.peer
def test_a_request_llama_cpp_refuses_comes_back_as_an_error(default_model_path):
    with PeerProcess(default_model_path, threads=1, n_ctx=64) as llama:
        with pytest.raises(PeerError, match="could not decode"):
            llama.decode(list(range(100)), 4)  # longer than the 64-token context
        assert llama.prefill_ms([1, 2, 3]) > 0, "the process stays up"


def test_the_peers_batched_sequences_start_from_prompts_that_differ():
    prompts = distinct_prompts(8, 32)

    assert len({prompt[0] for prompt in prompts}) == 8, "identical sequences would share a mixture's experts"
    assert all(len(prompt) == 32 and min(prompt) >= 1 for prompt in prompts)


@pytest.mark.peer
def test_batched_decode_gives_an_aggregate_rate_per_sequence_count(default_model_path):
    rates = batched_decode_tok_s(default_model_path, distinct_prompts(3, 16), [1, 3], new_tokens=4, threads=1)

    assert sorted(rates) == [1, 3] and all(rate > 0 for rate in rates.values())


@pytest.mark.peer
def test_the_decode_benchmark_runs_both_engines_in_turns(default_model_path):
    done = subprocess.run([sys.executable, "-m", "engine.bench", "decode", "--model", str(default_model_path), "--baseline",
                           "llama.cpp", "--prompt-tokens", "16", "--new-tokens", "8", "--rounds", "2", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [json.loads(line) for line in done.stdout.splitlines()]

    assert done.returncode == 0, done.stderr
    assert [line["round"] for line in lines[:-1]] == [1, 2]
    summary = lines[-1]
    assert summary["engine_decode_tok_s"] > 0 and summary["llama_cpp_decode_tok_s"] > 0
    assert summary["ratio"] == pytest.approx(summary["engine_decode_tok_s"] / summary["llama_cpp_decode_tok_s"], rel=0.01)
