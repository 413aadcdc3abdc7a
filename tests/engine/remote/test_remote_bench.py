"""``python -m engine.bench remote`` against the fake OpenAI-compatible server: rounds, medians, a clean failure."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.openai_fake import FakeOpenAIServer, FakeScript, free_port

REPO = Path(__file__).resolve().parents[3]


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "engine.bench", "remote", *args, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture
def fake_server():
    server = FakeOpenAIServer(FakeScript(piece_delay_s=0.002))
    yield server
    server.close()


def test_the_remote_bench_times_hearths_client_and_a_bare_one_in_turns(tmp_path, fake_server):
    done, lines = _bench(tmp_path, "--url", fake_server.base_url, "--model", "big-model", "--rounds", "3")

    assert done.returncode == 0, done.stderr
    rounds, summary = lines[:-1], lines[-1]
    assert [line["round"] for line in rounds] == [1, 2, 3]
    assert all(line["hearth_pieces"] == line["bare_pieces"] == 5 for line in rounds)
    assert summary["hearth_ttft_ms"] == round(statistics.median(line["hearth_ttft_ms"] for line in rounds), 2)
    assert summary["ttft_ratio"] == round(summary["hearth_ttft_ms"] / summary["bare_ttft_ms"], 3)
    assert summary["server_decode_tok_s"] == 64.25 and summary["ok"]


def test_an_unreachable_server_fails_as_data(tmp_path):
    done, lines = _bench(tmp_path, "--url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--rounds", "1")

    assert done.returncode == 2
    assert lines[-1]["ok"] is False and "Could not reach the server" in lines[-1]["error"]
