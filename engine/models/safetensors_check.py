"""Check safetensors files by their headers alone (engine thread, or any thread).

A safetensors file is an 8-byte little-endian header length, a JSON header that
maps tensor names to dtype, shape and byte range, then the raw tensor bytes. Only
the length and the header are read here: no tensor is loaded, so a damaged or
hostile file costs at most ``MAX_HEADER_BYTES`` of memory to reject.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.model_source import ModelFileError, read_model_json

MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
POSITIVE_CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
TOKEN_TABLE_NAMES = ("model.embed_tokens.weight", "lm_head.weight")

# Bits per element of every dtype the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it; ``begin``/``end`` index the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def n_elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked file: its tensors, and where its data section starts (``data_start``) and how long it is."""

    path: Path
    tensors: tuple[TensorEntry, ...]
    data_bytes: int
    data_start: int

    @property
    def n_params(self) -> int:
        return sum(tensor.n_elements for tensor in self.tensors)


def _damaged(path: Path, problem: str) -> ModelFileError:
    return ModelFileError(
        f"{path.name} is not a usable safetensors file: {problem}. "
        f"The file is damaged or was not fully downloaded; download it again. ({path})"
    )


def _read_header_bytes(path: Path) -> tuple[bytes, int]:
    """Return the raw JSON header and the size of the data section after it."""
    file_size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise _damaged(path, f"it is only {file_size} bytes long, too short to hold a header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES:
            raise _damaged(path, f"its header claims {header_len} bytes, over the {MAX_HEADER_BYTES} byte limit")
        if header_len > file_size - 8:
            raise _damaged(
                path, f"its header claims {header_len} bytes but the file is only {file_size} bytes long"
            )
        return handle.read(header_len), file_size - 8 - header_len


def _parse_json_header(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _damaged(path, f"its header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise _damaged(path, "its header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_entry(path: Path, name: str, info: Any) -> TensorEntry:
    """Build one entry, checking dtype, shape and that the byte range matches them."""
    if not isinstance(info, dict):
        raise _damaged(path, f"tensor {name!r} has no description in the header")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise ModelFileError(
            f"{path.name}: tensor {name!r} has dtype {dtype!r}, which Hearth does not know "
            f"(known: {', '.join(DTYPE_BITS)}). Convert the model with a current version of "
            f"safetensors, or pick another copy of it. ({path})"
        )
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        raise _damaged(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise _damaged(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    entry = TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
    expected_bits = entry.n_elements * DTYPE_BITS[dtype]
    if entry.end < entry.begin or expected_bits != (entry.end - entry.begin) * 8:
        raise _damaged(
            path,
            f"tensor {name!r} ({dtype}, shape {list(shape)}) needs {expected_bits / 8:g} bytes "
            f"but its byte range {entry.begin}..{entry.end} holds {entry.end - entry.begin}",
        )
    return entry


def _check_layout(path: Path, tensors: list[TensorEntry], data_bytes: int) -> None:
    """Tensors must tile the data section exactly: no overlap, no gap, nothing past the end."""
    position = 0
    previous: TensorEntry | None = None
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.end > data_bytes:
            raise _damaged(
                path,
                f"tensor {tensor.name!r} lies at bytes {tensor.begin}..{tensor.end} of the data "
                f"section, but the file holds only {data_bytes} bytes of data (it is truncated)",
            )
        if previous is not None and tensor.begin < position:
            raise _damaged(path, f"tensors {previous.name!r} and {tensor.name!r} overlap")
        if tensor.begin > position:
            raise _damaged(path, f"there is a gap of unused bytes before tensor {tensor.name!r}")
        position, previous = tensor.end, tensor
    if position != data_bytes:
        raise _damaged(path, f"{data_bytes - position} bytes follow the last tensor that no tensor uses")


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Validate ``path`` by its header only; raise ``ModelFileError`` saying what is wrong."""
    raw, data_bytes = _read_header_bytes(path)
    header = _parse_json_header(path, raw)
    tensors = [_tensor_entry(path, name, info) for name, info in header.items()]
    _check_layout(path, tensors, data_bytes)
    return SafetensorsHeader(path, tuple(tensors), data_bytes, data_start=8 + len(raw))


def _load_index(index_path: Path) -> dict[str, str]:
    """Return the index's tensor-name → shard-file map, checked for shape and safe names."""
    index = read_model_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFileError(
            f"{index_path.name} has no \"weight_map\" listing the shard files. "
            f"Download the model again. ({index_path})"
        )
    for tensor_name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise ModelFileError(
                f"{index_path.name} maps tensor {tensor_name!r} to {shard!r}, which is not a "
                f".safetensors file in the same folder. Hearth reads shards only from the model "
                f"folder itself. ({index_path})"
            )
    return weight_map


def read_sharded_headers(index_path: Path) -> list[SafetensorsHeader]:
    """Validate a sharded checkpoint: the index, that every shard exists, and each shard's header."""
    weight_map = _load_index(index_path)
    folder = index_path.parent
    headers = []
    for shard in sorted(set(weight_map.values())):
        shard_path = folder / shard
        if not shard_path.is_file():
            raise ModelFileError(
                f"{index_path.name} lists the shard {shard}, but it is missing from {folder}. "
                f"Download the missing file (every shard is needed)."
            )
        header = read_safetensors_header(shard_path)
        names = {tensor.name for tensor in header.tensors}
        missing = [name for name, owner in weight_map.items() if owner == shard and name not in names]
        if missing:
            raise ModelFileError(
                f"{index_path.name} says {shard} holds tensor {missing[0]!r}, but that shard does "
                f"not contain it. The shards and the index come from different downloads; "
                f"download the model again. ({shard_path})"
            )
        headers.append(header)
    return headers


def check_config_numbers(config_path: Path, config: dict[str, Any], headers: list[SafetensorsHeader]) -> None:
    """config.json's sizes must be positive and consistent with each other, the weights and the tokenizer.

    Raises ``ModelFileError`` naming the number, where transformers or a reply would fail with a bare
    ``ZeroDivisionError`` or ``IndexError``.
    """
    for key in POSITIVE_CONFIG_KEYS:
        if key in config and (not _is_count(config[key]) or config[key] == 0):
            raise _bad_config(config_path, f"{key} is {config[key]!r}, not a positive whole number")
    heads, width = config.get("num_attention_heads"), config.get("hidden_size")
    kv_heads = config.get("num_key_value_heads")
    if _is_count(heads) and kv_heads is not None and (not _is_count(kv_heads) or kv_heads == 0 or heads % kv_heads):
        raise _bad_config(config_path, f"num_key_value_heads {kv_heads!r} does not divide num_attention_heads {heads}")
    if config.get("head_dim") is None and _is_count(heads) and _is_count(width) and width % heads:
        raise _bad_config(config_path, f"hidden_size {width} does not split into {heads} attention heads")
    vocab_size = config.get("vocab_size")
    if _is_count(vocab_size):
        _check_token_rows(config_path, vocab_size, headers)
        _check_tokenizer_fits(config_path, vocab_size)


def _bad_config(config_path: Path, problem: str) -> ModelFileError:
    return ModelFileError(f"config.json is not usable: {problem}. Download the model again. ({config_path})")


def _check_token_rows(config_path: Path, vocab_size: int, headers: list[SafetensorsHeader]) -> None:
    for tensor in (t for header in headers for t in header.tensors if t.name in TOKEN_TABLE_NAMES):
        if len(tensor.shape) == 2 and tensor.shape[0] != vocab_size:
            raise _bad_config(config_path, f"vocab_size is {vocab_size} but {tensor.name} has {tensor.shape[0]} rows")


def _check_tokenizer_fits(config_path: Path, vocab_size: int) -> None:
    """Every id the tokenizer can produce must have a row in the token table."""
    tokenizer_path = config_path.with_name(TOKENIZER_FILE)
    if not tokenizer_path.is_file():
        return
    tokenizer = read_model_json(tokenizer_path)
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids = [*vocab.values()] if isinstance(vocab, dict) else [len(vocab) - 1] if isinstance(vocab, list) else []
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    ids += [token.get("id") for token in added or () if isinstance(token, dict)]
    largest = max((token_id for token_id in ids if _is_count(token_id)), default=-1)
    if largest >= vocab_size:
        raise _bad_config(
            config_path, f"vocab_size is {vocab_size} but {TOKENIZER_FILE} has token ids up to {largest}"
        )
