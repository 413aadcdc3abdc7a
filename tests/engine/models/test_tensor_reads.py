"""A tensor's bytes are read exactly, at any offset, on a system without ``os.pread``/``os.preadv`` (Windows) too; a
large read in spans at once, and a mapped tensor's bytes are the file's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.models.gguf_check import read_gguf
from engine.models.gguf_direct import GGUFState
from engine.models.tensor_reads import PARALLEL_READ_BYTES, mapped_bytes, read_exactly
from tests.engine.models.random_gguf import write_random_gguf


@pytest.fixture
def windows_like_os(monkeypatch):
    """``os`` as Windows has it: no positioned reads."""
    for name in ("pread", "preadv"):
        monkeypatch.delattr(os, name, raising=False)


def test_a_read_fills_the_buffer_from_its_offset(tmp_path: Path, windows_like_os):
    path = tmp_path / "bytes.bin"
    content = os.urandom(1 << 20)
    path.write_bytes(content)
    buffer = bytearray(70_000)
    read_exactly(path, memoryview(buffer), 123_457)
    assert bytes(buffer) == content[123_457:193_457]


def test_a_file_that_ends_before_the_tensor_does_is_an_error(tmp_path: Path, windows_like_os):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\1" * 100)
    with pytest.raises(OSError, match="ended while reading a tensor"):
        read_exactly(path, memoryview(bytearray(64)), 50)


def test_a_large_read_in_spans_fills_the_buffer_exactly(tmp_path: Path):
    path = tmp_path / "large.bin"
    content = os.urandom(PARALLEL_READ_BYTES + (1 << 20))
    path.write_bytes(content)
    buffer = bytearray(PARALLEL_READ_BYTES + 12_345)
    read_exactly(path, memoryview(buffer), 777)
    assert bytes(buffer) == content[777 : 777 + len(buffer)]


def test_mapped_bytes_are_the_files_at_any_offset_and_read_only(tmp_path: Path):
    path = tmp_path / "bytes.bin"
    content = os.urandom(300_000)
    path.write_bytes(content)
    mapped = mapped_bytes(path, 123_457, 70_000)  # not on a page boundary
    assert mapped.tobytes() == content[123_457:193_457] and not mapped.flags.writeable


def test_mapping_past_the_files_end_is_an_error_not_a_fault(tmp_path: Path):
    """Touching mapped bytes past a file's end would kill the process (SIGBUS): the map is refused first."""
    path = tmp_path / "short.bin"
    path.write_bytes(b"\1" * 100)
    with pytest.raises(OSError, match="ended while reading a tensor"):
        mapped_bytes(path, 50, 64)


def test_a_gguf_files_tensors_read_without_positioned_reads_are_the_files(tmp_path: Path, monkeypatch):
    path = write_random_gguf(tmp_path / "random.gguf", "llama")
    contents = read_gguf(path)
    expected = dict(GGUFState(path, contents, groups=False, report=lambda *_: None))
    for name in ("pread", "preadv"):
        monkeypatch.delattr(os, name, raising=False)
    read_here = GGUFState(path, contents, groups=False, report=lambda *_: None)
    assert all(torch.equal(read_here[name], tensor) for name, tensor in expected.items())
