"""``python -m engine.bench`` runs end to end on a tiny random model and fails cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _bench(tmp_path, *args):
    env = {**os.environ, "HEARTH_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.bench", *args, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done, lines


def test_decode_reports_engine_and_baseline_speed(tmp_path):
    done, lines = _bench(tmp_path, "decode", "--model", "random:tiny", "--device", "cpu",
                         "--prompt-tokens", "16", "--new-tokens", "8", "--baseline", "--rounds", "3")
    summary = lines[-1]
    assert done.returncode == 0, done.stderr
    rounds = [line for line in lines if "round" in line]
    assert [line["round"] for line in rounds] == [1, 2, 3] and all(line["hf_decode_tok_s"] > 0 for line in rounds)
    medians = sorted(line["engine_decode_tok_s"] for line in rounds)[1], sorted(line["hf_decode_tok_s"] for line in rounds)[1]
    assert (summary["engine_decode_tok_s"], summary["hf_decode_tok_s"]) == medians
    assert isinstance(summary["same_text_as_hf"], bool)  # fp16 weights on a random model may pick other tokens
    assert summary["ok"] and summary["backend"] == "FastLlamaBackend"
    assert summary["engine_decode_tok_s"] > 0 and summary["hf_decode_tok_s"] > 0
    assert summary["speedup"] > 0 and summary["bandwidth_limit_tok_s"] > 0
    assert summary["weight_bytes"] > 0 and summary["peak_memory_bytes"] > summary["weight_bytes"]
    assert 0 < summary["decode_bytes"] < summary["weight_bytes"], "a decode step reads one token's embedding row"


def test_serve_rounds_report_the_median_run_against_llama_cpps_median():
    from engine.bench.cli import _median_level

    runs = [{"steady_decode_tok_s": rate, "aggregate_decode_tok_s": rate / 2} for rate in (190.0, 150.0, 170.0)]
    row = _median_level(runs, [100.0, 130.0, 110.0])
    assert row["steady_decode_tok_s"] == 170.0 and row["aggregate_decode_tok_s"] == 85.0, "one run's figures"
    assert row["steady_decode_tok_s_rounds"] == [190.0, 150.0, 170.0] and row["llama_cpp_rounds"] == [100.0, 130.0, 110.0]
    assert row["llama_cpp_aggregate_decode_tok_s"] == 110.0 and row["steady_over_llama_cpp"] == round(170 / 110, 2)
    assert "rounds" not in _median_level(runs[:1], []), "one round: the line as before"


def test_join_rounds_report_each_ratios_median():
    from engine.bench.cli import _median_join

    joins = [{"join_ttft_ratio": ttft, "itl_p99_over_p50": itl} for ttft, itl in ((2.2, 2.5), (1.8, 3.4), (2.0, 2.9))]
    row = _median_join(joins)
    assert row["join_ttft_ratio"] == 2.0 and row["itl_p99_over_p50"] == 2.9, "the median run's own figures"
    assert row["join_ttft_ratio_median"] == 2.0 and row["itl_p99_over_p50_median"] == 2.9
    assert row["itl_p99_over_p50_rounds"] == [2.5, 3.4, 2.9]


def test_turns_reuse_the_conversation_cache(tmp_path):
    done, lines = _bench(tmp_path, "turns", "--model", "random:tiny", "--turns", "3", "--reply-tokens", "8")
    assert done.returncode == 0, done.stderr
    turns, summary = lines[:-1], lines[-1]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert turns[0]["reused_tokens"] == 0
    assert all(later["reused_tokens"] >= earlier["prompt_tokens"] for earlier, later in zip(turns, turns[1:]))
    assert summary["all_same_text"] is True and summary["ttft_ratio_last_first"] > 0


def test_load_of_a_broken_path_exits_2_with_a_json_error(tmp_path):
    done, lines = _bench(tmp_path, "load", "--model", str(tmp_path / "missing.gguf"))
    assert done.returncode == 2
    assert lines[-1]["ok"] is False and "missing.gguf" in lines[-1]["error"]
    assert "Traceback" not in done.stdout + done.stderr


def test_serve_reports_each_concurrency_level_a_shared_prefix_and_a_join(tmp_path):
    done, lines = _bench(tmp_path, "serve", "--model", "random:tiny", "--concurrency", "1,4", "--prompt-tokens", "40",
                         "--new-tokens", "6", "--shared-prefix", "32", "--join", "--join-tokens", "64")
    assert done.returncode == 0, done.stderr
    levels, joined, summary = lines[:2], lines[2], lines[-1]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert level["aggregate_decode_tok_s"] > 0 and level["ttft_ms_p99"] >= level["ttft_ms_p50"] > 0
        assert level["itl_ms_p99"] >= level["itl_ms_p50"] > 0
        assert level["kv_bytes_ideal"] <= level["kv_bytes"] <= level["kv_bytes_ideal"] + level["concurrency"] * level["kv_block_bytes"]
    assert 0 < levels[0]["steady_decode_tok_s"] and levels[1]["steady_decode_tok_s"] >= 0
    assert levels[1]["kv_bytes"] < 4 * levels[0]["kv_bytes"], "the four prompts' shared 32 tokens are held once"
    assert joined["join_prompt_tokens"] == 64 and joined["join_ttft_ms"] > 0 and joined["running_itl_ms_p50"] > 0
    assert summary["ok"] and summary["aggregate_over_single"]["1"] == 1.0


def test_serve_runs_half_its_requests_under_a_json_schema(tmp_path):
    done, lines = _bench(tmp_path, "serve", "--model", "random:tiny", "--concurrency", "4", "--prompt-tokens", "24",
                         "--new-tokens", "12", "--constrained-half")
    assert done.returncode == 0, done.stderr
    level = lines[0]
    assert level["constrained"] == 2 and level["aggregate_decode_tok_s"] > 0
