"""Streaming text never shows broken characters or loses spaces; stop strings are never shown."""

from __future__ import annotations

import pytest

from engine.chat.detokenize import IncrementalDetokenizer, StopStringFilter

TEXTS = [
    "Emoji 🔥🙂 and CJK 你好世界 日本語 한국어 are text too.",
    "The quick brown fox  jumps\nover the lazy dog.",
    "def main():\n    return 42\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_add_up_to_the_text_and_are_never_broken(tiny_loaded, text: str) -> None:
    tokenizer = tiny_loaded.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 5
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_an_emoji_split_over_byte_tokens_is_held_back_until_complete(tiny_loaded) -> None:
    tokenizer = tiny_loaded.tokenizer
    byte_ids = tokenizer("🦊", add_special_tokens=False)["input_ids"]
    assert len(byte_ids) > 1, "the fox emoji is not in the tiny vocabulary, so it spans byte tokens"
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(token_id) for token_id in byte_ids]
    assert pieces[:-1] == [""] * (len(byte_ids) - 1)
    assert pieces[-1] == "🦊"


def test_stop_string_split_across_pieces_is_caught_and_hidden() -> None:
    stops = StopStringFilter(["\nUser:"])
    shown = [stops.feed(piece) for piece in ["Hello", " there\n", "Us", "er: again"]]
    assert "".join(shown) == "Hello there"
    assert stops.stopped


def test_text_that_only_looked_like_a_stop_string_is_released() -> None:
    stops = StopStringFilter(["\nUser:"])
    shown = [stops.feed(piece) for piece in ["Hello\n", "Us", "ually fine"]]
    assert "".join(shown) + stops.flush() == "Hello\nUsually fine"
    assert not stops.stopped


def test_held_back_text_is_flushed_at_the_end() -> None:
    stops = StopStringFilter(["</s>"])
    assert stops.feed("done <") == "done "
    assert stops.flush() == "<"
