"""Damaged safetensors files are refused by their header alone, each with its own reason."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from engine.models.model_source import ModelFileError
from engine.models.safetensors_check import read_safetensors_header, read_sharded_headers


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ModelFileError) as caught:
        read_safetensors_header(path)
    message = str(caught.value)
    assert path.name in message
    return message


def test_valid_file_counts_parameters(tmp_path: Path, build: Any) -> None:
    header, data = build.f32_header({"a": [3, 4], "b": [5]})
    checked = read_safetensors_header(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, data)))
    assert checked.n_params == 17
    assert checked.data_bytes == 68


def test_truncated_file_is_refused(tmp_path: Path, build: Any) -> None:
    header, data = build.f32_header({"a": [64, 64]})
    path = write(tmp_path / "model.safetensors", build.safetensors_bytes(header, data)[:-100])
    assert "truncated" in refusal(path)


def test_file_shorter_than_the_length_prefix(tmp_path: Path) -> None:
    assert "too short" in refusal(write(tmp_path / "model.safetensors", b"\x01\x02"))


def test_header_length_beyond_file_size(tmp_path: Path, build: Any) -> None:
    header, data = build.f32_header({"a": [2]})
    path = write(tmp_path / "model.safetensors", build.safetensors_bytes(header, data, header_len=10_000))
    assert "claims 10000 bytes" in refusal(path)


def test_header_length_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    path = write(tmp_path / "model.safetensors", struct.pack("<Q", 2**40) + b"{}")
    assert "limit" in refusal(path)


def test_header_that_is_not_json(tmp_path: Path) -> None:
    raw = b"not json at all"
    path = write(tmp_path / "model.safetensors", struct.pack("<Q", len(raw)) + raw)
    assert "not valid JSON" in refusal(path)


def test_header_that_is_a_json_list(tmp_path: Path) -> None:
    raw = b"[1, 2]"
    assert "not a JSON object" in refusal(write(tmp_path / "m.safetensors", struct.pack("<Q", len(raw)) + raw))


def test_offsets_beyond_the_file(tmp_path: Path, build: Any) -> None:
    header = {"a": {"dtype": "U8", "shape": [1000], "data_offsets": [10_000, 11_000]}}
    path = write(tmp_path / "model.safetensors", build.safetensors_bytes(header, bytes(16)))
    message = refusal(path)
    assert "'a'" in message and "10000..11000" in message


def test_unknown_dtype(tmp_path: Path, build: Any) -> None:
    header = {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}
    message = refusal(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, bytes(16))))
    assert "'F128'" in message and "BF16" in message


def test_shape_and_dtype_not_matching_byte_range(tmp_path: Path, build: Any) -> None:
    header = {"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 16]}}
    message = refusal(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, bytes(16))))
    assert "needs 32 bytes" in message and "holds 16" in message


def test_overlapping_tensors(tmp_path: Path, build: Any) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    message = refusal(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, bytes(24))))
    assert "'a' and 'b' overlap" in message


def test_unused_trailing_bytes(tmp_path: Path, build: Any) -> None:
    header, data = build.f32_header({"a": [4]})
    message = refusal(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, data + bytes(8))))
    assert "8 bytes follow the last tensor" in message


@pytest.fixture
def shard_index(tmp_path: Path, build: Any) -> Path:
    """Two valid shards and their index in tmp_path; returns the index path."""
    folder = tmp_path
    for shard, name in (("model-00001-of-00002.safetensors", "a"), ("model-00002-of-00002.safetensors", "b")):
        header, data = build.f32_header({name: [2, 2]})
        write(folder / shard, build.safetensors_bytes(header, data))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    return write(folder / "model.safetensors.index.json", json.dumps(index).encode())


def test_sharded_checkpoint_reads_every_shard(tmp_path: Path, shard_index: Path) -> None:
    headers = read_sharded_headers(shard_index)
    assert sum(header.n_params for header in headers) == 8


def test_sharded_checkpoint_with_a_missing_shard(tmp_path: Path, shard_index: Path) -> None:
    index = shard_index
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelFileError, match="model-00002-of-00002.safetensors, but it is missing"):
        read_sharded_headers(index)


def test_sharded_checkpoint_with_a_damaged_shard(tmp_path: Path, shard_index: Path) -> None:
    index = shard_index
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(ModelFileError, match="model-00001-of-00002.safetensors is not a usable"):
        read_sharded_headers(index)


def test_index_that_is_not_json(tmp_path: Path) -> None:
    index = write(tmp_path / "model.safetensors.index.json", b"{oops")
    with pytest.raises(ModelFileError, match="model.safetensors.index.json is not valid JSON"):
        read_sharded_headers(index)


def test_index_pointing_outside_the_folder(tmp_path: Path) -> None:
    index = {"weight_map": {"a": "../elsewhere/model.safetensors"}}
    path = write(tmp_path / "model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(ModelFileError, match="not a .safetensors file in the same folder"):
        read_sharded_headers(path)


def test_index_naming_a_tensor_the_shard_lacks(tmp_path: Path, shard_index: Path) -> None:
    index_path = shard_index
    index = json.loads(index_path.read_text())
    index["weight_map"]["c"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="holds tensor 'c'"):
        read_sharded_headers(index_path)


def test_gap_before_a_tensor(tmp_path: Path, build: Any) -> None:
    header = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}
    message = refusal(write(tmp_path / "model.safetensors", build.safetensors_bytes(header, bytes(8))))
    assert "gap of unused bytes before tensor 'a'" in message
