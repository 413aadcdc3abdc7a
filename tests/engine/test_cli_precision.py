"""The command line's load options: precision names (int4 for 4 bits, an earlier version's nf4 still accepted), the
context, the KV cache and the draft model."""

from __future__ import annotations

import pytest

from engine.cli import parse_args


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_nf4_from_an_earlier_version_loads_int4(command: str):
    assert parse_args([command, "--precision", "nf4"]).precision == "int4"
    assert parse_args([command, "--precision", "int4"]).precision == "int4"
    assert parse_args([command]).precision == "auto"


def test_an_unknown_precision_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        parse_args(["chat", "--precision", "fp8"])
    assert "int4" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_the_context_is_asked_for_on_the_command_line(command: str):
    from engine.api.server.standalone import load_options

    assert load_options(parse_args([command, "--context", "8192"])).context_length == 8192
    assert load_options(parse_args([command])).context_length is None  # what fits, up to 32 768


@pytest.mark.parametrize("value", ["0", "-5", "32k"])
def test_a_context_that_is_not_a_positive_number_is_refused(value: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        parse_args(["serve", "--context", value])
    assert "--context" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_the_kv_cache_is_asked_for_on_the_command_line(command: str, capsys: pytest.CaptureFixture[str]):
    from engine.api.server.standalone import load_options

    assert load_options(parse_args([command, "--kv-cache", "int8"])).kv_cache == "int8"
    assert load_options(parse_args([command])).kv_cache == "auto"  # bf16 on the CPU
    with pytest.raises(SystemExit):
        parse_args([command, "--kv-cache", "fp8"])
    assert "int8" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_the_draft_model_is_asked_for_on_the_command_line(command: str):
    from engine.api.server.standalone import load_options

    assert load_options(parse_args([command, "--draft-model", "default"])).draft_model == "default"
    assert load_options(parse_args([command, "--draft-model", "/m/small.gguf"])).draft_model == "/m/small.gguf"
    assert load_options(parse_args([command])).draft_model is None  # no draft model unless asked


def test_the_load_line_says_which_draft_model_is_on():
    from engine.api.server.standalone import load_line
    from engine.protocol.messages import ModelLoaded

    loaded = ModelLoaded("r", "Big", "/big.gguf", "cpu", "fp16 weights", 8192, 1.0, draft_model="Small")
    assert load_line(loaded).endswith("8192-token context, drafting with Small")
    assert "drafting" not in load_line(ModelLoaded("r", "Big", "/big.gguf", "cpu", "fp16 weights", 8192, 1.0))
