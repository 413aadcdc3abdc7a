"""Figures are written the way a person reads them."""

import pytest

from app.perf.format import (
    format_bytes,
    format_count,
    format_finish_reason,
    format_ms,
    format_number,
    format_tok_s,
    format_tokens,
)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "—"), (0.42, "0.4 ms"), (3.84, "3.8 ms"), (120.4, "120 ms"), (2345.0, "2.35 s"), (65_000.0, "1 min 05 s")],
)
def test_durations(ms, text):
    assert format_ms(ms) == text


@pytest.mark.parametrize(("tok_s", "text"), [(None, "—"), (8.44, "8.4 tok/s"), (1250.4, "1,250 tok/s")])
def test_speeds(tok_s, text):
    assert format_tok_s(tok_s) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "—"), (512, "512 B"), (1536, "1.50 KiB"), (37.5 * 1024**2, "37.5 MiB"), (3 * 1024**3, "3.00 GiB"), (300 * 1024**3, "300 GiB")],
)
def test_sizes_use_binary_units(size, text):
    assert format_bytes(size) == text


def test_counts_and_tokens():
    assert format_count(12345) == "12,345"
    assert format_tokens(1) == "1 token"
    assert format_tokens(1024) == "1,024 tokens"
    assert format_number(2.5) == "2.5"
    assert format_number(1000.0) == "1,000"


def test_finish_reasons_in_words():
    assert format_finish_reason(None) == "streaming…"
    assert format_finish_reason("max_tokens") == "token limit reached"
    assert format_finish_reason("context_full") == "context full"
