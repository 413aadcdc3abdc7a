"""``python -m engine.bench.gpu_check --quick`` runs every step on a tiny CPU model and records each as a JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import random_gguf
from engine.bench.gpu_check import FULL_LINES, chosen_steps

REPO = Path(__file__).resolve().parents[3]


def test_quick_check_records_every_line_and_a_failing_line_does_not_stop_the_rest(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.bench.gpu_check", str(out), "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {record["line"]: record for record in map(json.loads, (out / "gpu_bench.jsonl").read_text().splitlines())}
    assert lines["wheels"]["ok"]  # every package a carried wheel would bring is importable here
    assert list(lines) == ["wheels", "environment", "pytest_gpu", "decode_tiny", "decode_tiny_int8",
                           "decode_unknown_model", "prefill_tiny", "chat_ttft_tiny", "serve_tiny_batched"]
    assert lines["pytest_gpu"]["ok"] and lines["pytest_gpu"]["skipped"] == lines["pytest_gpu"]["tests"] > 0
    assert json.loads((out / "gpu_tests.json").read_text())["tests"] == lines["pytest_gpu"]["tests"]
    assert (out / "gpu_tests.xml").is_file()
    decode = lines["decode_tiny"]
    assert decode["ok"] and decode["engine_decode_tok_s"] > 0 and decode["hf_decode_tok_s"] > 0
    assert decode["targets"] == [{"key": "engine_decode_tok_s", "target": ">= 1", "value": decode["engine_decode_tok_s"],
                                  "met": decode["engine_decode_tok_s"] >= 1}]
    assert lines["decode_tiny_int8"]["ok"] and lines["decode_tiny_int8"]["precision"] == "int8"
    failed = lines["decode_unknown_model"]
    assert not failed["ok"] and "Unknown random model 'nonesuch'" in failed["error"]
    assert failed["targets"][0]["met"] is False
    assert lines["prefill_tiny"]["ok"] and lines["prefill_tiny"]["prefill_ms"] > 0
    assert lines["chat_ttft_tiny"]["ok"] and lines["chat_ttft_tiny"]["ttft_ms"] > 0
    serve = lines["serve_tiny_batched"]
    assert serve["ok"] and serve["device"] == "cpu" and set(serve["aggregate_decode_tok_s"]) == {"1", "4"}


def test_only_runs_the_named_steps_and_a_wrong_name_lists_the_real_ones():
    assert chosen_steps(None, FULL_LINES) == {"pytest_gpu", *(line.name for line in FULL_LINES)}
    assert chosen_steps("pytest_gpu, load_8b_q4_k_m_gguf", FULL_LINES) == {"pytest_gpu", "load_8b_q4_k_m_gguf"}
    with pytest.raises(ValueError, match="no step named decode_9b.*the steps: pytest_gpu, decode_8b_bf16"):
        chosen_steps("decode_9b", FULL_LINES)


def test_every_random_gguf_file_the_full_check_names_is_one_the_bench_writes():
    named = [line.args[line.args.index("--model") + 1] for line in FULL_LINES if "--model" in line.args]
    files = [model for model in named if random_gguf.is_random_gguf(model)]
    assert files, "the full check loads a GGUF file"
    assert [random_gguf.parse(model) for model in files] == [("llama3-8b", "q4_k_m")] * len(files)
