"""Builders for model files, good and bad, written into each test's tmp_path."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TINY_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"


class Build:
    """Byte-level builders for crafting good and bad files (the ``build`` fixture)."""

    @staticmethod
    def safetensors_bytes(header: dict[str, Any], data: bytes, header_len: int | None = None) -> bytes:
        """A safetensors file from a header dict and raw data; ``header_len`` may lie on purpose."""
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data

    @staticmethod
    def f32_header(shapes: dict[str, list[int]]) -> tuple[dict[str, Any], bytes]:
        """A valid header laying out F32 tensors back to back, and zero data to match."""
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in shapes.items():
            size = 4 * int(np.prod(shape))
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        return header, bytes(offset)

    @staticmethod
    def gguf_kv(key: str, value_type: int, payload: bytes) -> bytes:
        raw_key = key.encode()
        return struct.pack("<Q", len(raw_key)) + raw_key + struct.pack("<I", value_type) + payload

    @staticmethod
    def gguf_header(tensor_count: int, kv_count: int, version: int = 3) -> bytes:
        return b"GGUF" + struct.pack("<IQQ", version, tensor_count, kv_count)


@pytest.fixture
def build() -> type[Build]:
    return Build


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, tiny Llama checkpoint saved by transformers (safetensors), with a chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TINY_TEMPLATE}))
    return folder


@pytest.fixture
def hf_copy(tiny_hf_folder: Path, tmp_path: Path) -> Callable[[], Path]:
    """A fresh copy of the tiny checkpoint that a test may damage."""
    def make() -> Path:
        return Path(shutil.copytree(tiny_hf_folder, tmp_path / tiny_hf_folder.name))
    return make


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Callable[..., Path]:
    """Write a small valid GGUF (written by the gguf package itself) for ``architecture``."""
    import gguf

    def make(architecture: str = "llama", template: str | None = TINY_TEMPLATE) -> Path:
        path = tmp_path / f"tiny-{architecture}.gguf"
        writer = gguf.GGUFWriter(str(path), architecture)
        writer.add_block_count(2)
        writer.add_context_length(256)
        writer.add_embedding_length(32)
        writer.add_feed_forward_length(64)
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
        writer.add_token_list([f"t{i}" for i in range(100)])
        if template is not None:
            writer.add_chat_template(template)
        writer.add_tensor("token_embd.weight", np.zeros((100, 32), dtype=np.float32))
        writer.add_tensor("blk.0.attn_q.weight", np.ones((32, 32), dtype=np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path
    return make
