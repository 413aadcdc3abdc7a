"""Runs a test script's Triton kernels in Triton's interpreter, on the CPU, in a process of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRITON_SITE = REPO / ".triton"
"""Where ``make test`` installs Triton, apart from .venv (Makefile): only the interpreter's process imports it."""


def assert_passes_in_the_interpreter(script: str) -> None:
    """``script`` (ending with ``print('ok')``) runs to its end under ``TRITON_INTERPRET=1``, with Triton from this
    Python's packages or from ``TRITON_SITE``; skips where neither has it."""
    if importlib.util.find_spec("triton") is not None:
        extra = []
    elif (TRITON_SITE / "triton").is_dir():
        extra = [str(TRITON_SITE)]
    else:
        pytest.skip("Triton is not installed (`make test` puts it in .triton/ on Linux x86-64)")
    path = os.pathsep.join([*extra, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
