"""``python -m engine serve``: loads the model, serves it, refuses unsafe or impossible settings, stops on Ctrl+C."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[3]


def _start(*args: str) -> tuple[subprocess.Popen, queue.Queue]:
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", *args], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    return process, lines


def _line_matching(lines: queue.Queue, pattern: str, timeout: float = 120) -> re.Match:
    seen = []
    while True:
        line = lines.get(timeout=timeout)
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
        assert len(seen) < 200, "".join(seen)


def test_serve_answers_and_stops_on_ctrl_c(tiny_model_dir) -> None:
    with socket.socket() as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process, lines = _start("--model", str(tiny_model_dir), "--port", str(port), "--device", "cpu", "--context", "512")
    try:
        loaded = _line_matching(lines, r"(\d+)-token context, (\w+) KV cache; model id '([^']+)'")
        model_id = loaded.group(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as answer:
            listed = json.load(answer)["data"][0]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        # Greedy: sampled at the API's default temperature, the random model's four tokens were once all blank.
        reply = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Paris"}],
                                               max_tokens=4, temperature=0)
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        process.kill()

    assert reply.choices[0].message.content
    assert code == 0
    assert loaded.group(1) == "512"  # of the 1 024 it was trained for
    assert (listed["context_length"], listed["max_model_len"]) == (512, 512)
    assert listed["context_reason"] == "512 of 1 024 tokens, as asked"
    assert loaded.group(2) == listed["kv_cache"] == "bf16"  # the CPU's, unless int8 is asked for


def test_serve_takes_the_int8_kv_cache_asked_for_and_refuses_heads_it_cannot_group(tiny_model_dir) -> None:
    """The tiny model's heads are 16 values wide: too narrow for a scale per 32, so the load says so and stops."""
    process, lines = _start("--model", str(tiny_model_dir), "--device", "cpu", "--context", "512", "--kv-cache", "int8")

    assert process.wait(timeout=120) == 2
    assert _line_matching(lines, r"int8 KV cache takes heads of a multiple of 32 values, and this model's have 16",
                          timeout=10)


def test_serve_refuses_a_context_past_the_trained_one(tiny_model_dir) -> None:
    process, lines = _start("--model", str(tiny_model_dir), "--device", "cpu", "--context", "4096")

    assert process.wait(timeout=120) == 2
    assert _line_matching(lines, r"trained for 1 024 tokens of context; a context of 4 096 cannot be used", timeout=10)


def test_serve_refuses_other_machines_without_a_key_and_a_taken_port(tiny_model_dir) -> None:
    open_to_all, open_lines = _start("--model", str(tiny_model_dir), "--host", "0.0.0.0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy, busy_lines = _start("--model", str(tiny_model_dir), "--port", str(taken.getsockname()[1]))
        busy_code = busy.wait(timeout=120)

    assert open_to_all.wait(timeout=120) == 2
    assert _line_matching(open_lines, r"0\.0\.0\.0.*set an API key", timeout=10)
    assert busy_code == 2
    assert _line_matching(busy_lines, r"Cannot listen on 127\.0\.0\.1:\d+", timeout=10)
