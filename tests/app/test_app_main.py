"""Command line of ``python -m app``."""

from __future__ import annotations

from app.main import parse_args


def test_model_defaults_to_the_built_in_one():
    args, qt_args = parse_args([])

    assert args.model == "default"
    assert qt_args == []


def test_model_path_is_taken_and_qt_options_are_passed_on():
    args, qt_args = parse_args(["--model", "/models/qwen.gguf", "-platform", "offscreen"])

    assert args.model == "/models/qwen.gguf"
    assert qt_args == ["-platform", "offscreen"]


def test_a_terminate_signal_closes_the_app_cleanly(tmp_path):
    """``kill`` (SIGTERM) closes the window like the user would: exit code 0, no crash at shutdown."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_HOME": str(tmp_path)}
    app = subprocess.Popen(
        [sys.executable, "-m", "app", "--model", str(tmp_path / "no-such-model.gguf")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    time.sleep(4)  # the window is up and the engine thread has started
    assert app.poll() is None, app.communicate()[0]
    app.send_signal(signal.SIGTERM)
    output, _ = app.communicate(timeout=30)
    assert app.returncode == 0, output
