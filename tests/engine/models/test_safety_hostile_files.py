"""Crafted model files are refused at inspection, quickly, in bounded memory, with a one-line reason."""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest

from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError
from engine.protocol.messages import ChatMessage, LoadFailed, ModelLoaded

STRING, ARRAY = 8, 9


def refused_quickly(path: Path) -> str:
    """The refusal of ``path``, asserting it came within 10 s and 512 MB of Python allocations."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ModelFileError) as caught:
            inspect_model(path)
        assert time.monotonic() - started < 10
        assert tracemalloc.get_traced_memory()[1] < 512 * 1024**2
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def write_gguf(path: Path, heads: int = 4, tokens: int = 100, table_rows: int = 100,
               vocab_size: int | None = None, architecture: str = "llama", ints: dict[str, int] | None = None) -> Path:
    """A small GGUF (llama's, unless ``architecture`` says) whose head count, vocabulary, token table and further
    integer metadata (``ints``, keys without the architecture's prefix) the test chooses."""
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in (ints or {}).items():
        writer.add_int32(f"{architecture}.{key}", value)
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(heads)
    writer.add_head_count_kv(min(heads, 2))
    if vocab_size is not None:
        writer.add_vocab_size(vocab_size)
    writer.add_token_list([f"t{i}" for i in range(tokens)])
    writer.add_tensor("token_embd.weight", np.zeros((table_rows, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_fifo_named_gguf_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    assert "not a regular file" in refused_quickly(fifo)


def test_fifo_inside_a_model_folder_is_refused(tiny_hf_folder: Path, hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    (folder / "tokenizer.json").unlink(missing_ok=True)
    os.mkfifo(folder / "tokenizer.json")
    assert "tokenizer.json is not a regular file" in refused_quickly(folder)


def test_zero_attention_heads_in_a_gguf(tmp_path: Path) -> None:
    assert "llama.attention.head_count is 0, not a positive number" in refused_quickly(
        write_gguf(tmp_path / "m.gguf", heads=0)
    )


@pytest.mark.parametrize(("key", "value", "says"), [
    ("attention.sliding_window_pattern", 0, "gemma3.attention.sliding_window_pattern is 0, neither a period nor a flag"),
    ("attention.sliding_window", -512, "gemma3.attention.sliding_window is -512, not a number of tokens"),
])
def test_a_gemma_file_whose_windows_make_no_sense(tmp_path: Path, key: str, value: int, says: str) -> None:
    assert says in refused_quickly(write_gguf(tmp_path / "m.gguf", architecture="gemma3", ints={key: value}))


def test_two_million_empty_tokens(tmp_path: Path, build) -> None:
    count = 2_000_000
    empty_tokens = struct.pack("<IQ", STRING, count) + bytes(8 * count)
    path = tmp_path / "m.gguf"
    path.write_bytes(
        build.gguf_header(0, 2)
        + build.gguf_kv("general.architecture", STRING, struct.pack("<Q", 5) + b"llama")
        + build.gguf_kv("tokenizer.ggml.tokens", ARRAY, empty_tokens)
        + bytes(64)
    )
    assert "claims 2000000 items, more than the 1048576 Hearth reads" in refused_quickly(path)


def test_vocab_size_smaller_than_the_tokenizer(tmp_path: Path) -> None:
    assert "vocab_size 50 is smaller than its tokenizer's 100 tokens" in refused_quickly(
        write_gguf(tmp_path / "m.gguf", vocab_size=50)
    )


def test_token_table_shorter_than_the_tokenizer(tmp_path: Path) -> None:
    assert "token_embd.weight has 50 rows for the tokenizer's 100 tokens" in refused_quickly(
        write_gguf(tmp_path / "m.gguf", table_rows=50)
    )


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_zero_attention_heads_in_config_json(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    _edit_config(folder, num_attention_heads=0)
    assert "num_attention_heads is 0, not a positive whole number" in refused_quickly(folder)


def test_config_vocab_size_against_weights_and_tokenizer(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": vocab_size + 5}}}))
    assert f"tokenizer.json has token ids up to {vocab_size + 5}" in refused_quickly(folder)
    _edit_config(folder, vocab_size=vocab_size - 1)
    assert f"vocab_size is {vocab_size - 1} but" in refused_quickly(folder)


def test_engine_refuses_a_fifo_and_answers_the_next_request(
    engine_driver, tiny_model_dir: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    engine = engine_driver()
    try:
        started = time.monotonic()
        refused = engine.load(str(fifo))
        assert isinstance(refused, LoadFailed) and "not a regular file" in refused.message
        assert time.monotonic() - started < 10
        assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
        assert engine.ask("c1", [ChatMessage("user", "Hello")]).reply.text
    finally:
        engine.thread.stop()
