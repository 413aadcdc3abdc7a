"""The command line's precision names: int4 for 4 bits, and an earlier version's nf4 still accepted."""

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
