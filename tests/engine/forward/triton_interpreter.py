"""Runs a test script's Triton kernels in Triton's interpreter, on the CPU, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def assert_passes_in_the_interpreter(script: str) -> None:
    """``script`` (ending with ``print('ok')``) runs to its end under ``TRITON_INTERPRET=1``; skips without Triton."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
