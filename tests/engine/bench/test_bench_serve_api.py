"""``python -m engine.bench serve-api`` times the same replies direct and through the API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_serve_api_reports_what_the_server_adds(tmp_path, tiny_model_dir):
    env = {**os.environ, "HEARTH_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "engine.bench", "serve-api", "--model", str(tiny_model_dir), "--device", "cpu",
         "--new-tokens", "8", "--rounds", "3", "--clients", "3", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    assert done.returncode == 0, done.stderr
    rounds, summary = lines[:-1], lines[-1]
    assert [line["round"] for line in rounds] == [1, 2, 3]
    assert summary["ok"] and summary["same_text"] is True  # greedy: the server changes nothing in the reply
    assert summary["served_ttft_ms"] == sorted(line["served_ttft_ms"] for line in rounds)[1]
    assert summary["decode_time_ratio"] > 0 and summary["pieces"] >= 2
    assert summary["clients"] == 3 and summary["served_completed"] == 3  # every concurrent client got its reply
    assert summary["served_aggregate_tok_s"] > 0 and summary["direct_aggregate_tok_s"] > 0
