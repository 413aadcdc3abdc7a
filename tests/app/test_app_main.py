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
