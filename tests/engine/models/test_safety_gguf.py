"""GGUF files are walked with every count bounded; hostile ones fail fast with a reason."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from engine.models.gguf_check import explain_gguf_errors, read_gguf
from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError

STRING, ARRAY, UINT8, UINT32 = 8, 9, 0, 4


def refusal(path: Path) -> str:
    started = time.monotonic()
    with pytest.raises(ModelFileError) as caught:
        inspect_model(path)
    assert time.monotonic() - started < 30  # refused promptly, not after walking fake counts
    message = str(caught.value)
    assert path.name in message
    return message


def test_random_bytes_named_gguf(tmp_path: Path) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(os.urandom(4096))
    assert "does not start with the GGUF magic" in refusal(path)


def test_tiny_file_named_gguf(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    assert "too short" in refusal(path)


def test_unsupported_version(tmp_path: Path, build: Any) -> None:
    path = tmp_path / "old.gguf"
    path.write_bytes(build.gguf_header(0, 0, version=1) + bytes(64))
    assert "version 1" in refusal(path)


def test_absurd_tensor_count_refused_before_allocating(tmp_path: Path, build: Any) -> None:
    path = tmp_path / "liar.gguf"
    path.write_bytes(build.gguf_header(2**40, 0) + bytes(1000))
    assert f"claims {2**40} tensors" in refusal(path)


def test_absurd_metadata_count(tmp_path: Path, build: Any) -> None:
    path = tmp_path / "liar.gguf"
    path.write_bytes(build.gguf_header(0, 2**40) + bytes(1000))
    assert f"{2**40} metadata entries" in refusal(path)


def test_array_claiming_more_items_than_the_file_holds(tmp_path: Path, build: Any) -> None:
    """The case that makes gguf.GGUFReader loop for hours: caught before reading items."""
    array = struct.pack("<IQ", UINT8, 2**40)
    path = tmp_path / "array.gguf"
    path.write_bytes(build.gguf_header(0, 1) + build.gguf_kv("general.junk", ARRAY, array) + bytes(64))
    assert f"claims {2**40} items" in refusal(path)


def test_string_longer_than_the_file(tmp_path: Path, build: Any) -> None:
    value = struct.pack("<Q", 10**12) + b"llama"
    path = tmp_path / "string.gguf"
    path.write_bytes(build.gguf_header(0, 1) + build.gguf_kv("general.architecture", STRING, value))
    assert "ends at byte" in refusal(path)


def test_unknown_metadata_value_type(tmp_path: Path, build: Any) -> None:
    path = tmp_path / "type.gguf"
    path.write_bytes(build.gguf_header(0, 1) + build.gguf_kv("general.x", 99, b"\0" * 16))
    assert "unknown value type 99" in refusal(path)


def test_truncated_tensor_data(tiny_gguf: Callable[..., Path]) -> None:
    path = tiny_gguf()
    path.write_bytes(path.read_bytes()[:-512])
    assert "truncated" in refusal(path)


def test_valid_gguf_is_accepted_with_its_architecture(tiny_gguf: Callable[..., Path]) -> None:
    source = inspect_model(tiny_gguf())
    assert source.kind == "gguf"
    assert source.config["architecture"] == "llama"
    assert source.config["block_count"] == 2
    assert source.config["context_length"] == 256
    assert source.config["head_count_kv"] == 2
    assert source.config["vocab_size"] == 100
    assert source.n_params == 100 * 32 + 32 * 32
    assert source.total_weight_bytes == 100 * 32 * 4 + 32 * 32 * 2
    assert source.chat_template_source is not None and "messages" in source.chat_template_source


def test_unsupported_gguf_architecture(tiny_gguf: Callable[..., Path]) -> None:
    assert "'rwkv6' model, which Hearth cannot load from GGUF" in refusal(tiny_gguf("rwkv6"))


def test_gguf_reader_errors_are_explained(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "noise.gguf"
    path.write_bytes(os.urandom(256))
    with pytest.raises(ModelFileError, match="the gguf reader failed: GGUF magic invalid"):
        with explain_gguf_errors(path):
            gguf.GGUFReader(path)


def test_real_default_model(default_model_path: Path) -> None:
    source = inspect_model(default_model_path)
    assert source.name == default_model_path.stem
    assert source.config["architecture"] == "llama"
    assert source.config["block_count"] == 30
    assert source.config["head_count"] == 9 and source.config["head_count_kv"] == 3
    assert source.config["vocab_size"] == 49152
    assert source.config["file_type"] == "MOSTLY_Q4_1"
    assert source.four_bit_layers
    assert 130e6 < source.n_params < 140e6
    assert "<|im_start|>" in (source.chat_template_source or "")
    assert len(read_gguf(default_model_path).tensors) == 272
