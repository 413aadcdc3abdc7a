"""Check a GGUF file and read its metadata with every length bounded (engine thread, or any).

``gguf.GGUFReader`` trusts the counts in a file: an array that claims 2**40 items
in a tiny file makes it loop (and allocate) for hours. So Hearth walks the header,
the key/value metadata and the tensor table itself, checking each count against
the bytes left in the file (and arrays against ``MAX_ARRAY_ITEMS``) before reading
on, and keeps only small values (long arrays, such as the vocabulary, are skipped
over and only counted). ``gguf_config`` then checks the shape numbers and that the
token table has a row for every token, so a broken file is refused with a reason
rather than failing later with a bare ``ZeroDivisionError`` or ``IndexError``. The format's
constants (value types, quantization block sizes) come from the ``gguf`` package.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from engine.forward.windows import FULL, SLIDING, layer_windows
from engine.models.model_source import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_KEPT_ARRAY = 64  # arrays longer than this are counted, not kept
HEADER_BYTES = 24  # magic, version, tensor count, key/value count
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, dims count, type, offset
MAX_ARRAY_ITEMS = 1 << 20  # the longest real arrays, a vocabulary and its merges, hold ~262 k and ~500 k
POSITIVE_KEYS = ("block_count", "embedding_length", "head_count")  # GGUF_CONFIG_KEYS a model cannot do without

SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    quant_type: GGMLQuantizationType
    n_elements: int
    n_bytes: int
    offset: int  # from the start of the data section
    dims: tuple[int, ...] = ()  # GGUF's order: the row length first

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape as torch and numpy write it: [rows, row length] for a matrix."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFContents:
    """What the walk found: kept metadata, lengths of long arrays, and the tensor table."""

    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[GGUFTensorInfo, ...]
    data_start: int


def _error(path: Path, problem: str, advice: str = "Download the file again.") -> ModelFileError:
    return ModelFileError(f"{path.name} is not a usable GGUF file: {problem}. {advice} ({path})")


class _Cursor:
    """Reads little-endian values from a buffer, refusing to read past its end."""

    def __init__(self, path: Path, buffer: mmap.mmap | bytes, position: int = 0) -> None:
        self.path, self.buffer, self.position = path, buffer, position

    @property
    def remaining(self) -> int:
        return len(self.buffer) - self.position

    def take(self, size: int, what: str) -> bytes:
        if size > self.remaining:
            raise _error(self.path, f"it ends at byte {len(self.buffer)} while reading {what}")
        chunk = self.buffer[self.position : self.position + size]
        self.position += size
        return chunk

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def skip_strings(self, count: int, what: str) -> None:
        """Step over ``count`` strings, checking only that each fits in the file (a vocabulary: ~100 k)."""
        position, end = self.position, len(self.buffer)
        for _ in range(count):
            if position + 8 > end:
                raise _error(self.path, f"it ends at byte {end} while reading {what}")
            position += 8 + _U64.unpack_from(self.buffer, position)[0]
        if position > end:
            raise _error(self.path, f"it ends at byte {end} while reading {what}")
        self.position = position

    def string(self, what: str) -> str:
        length = self.unpack("<Q", f"the length of {what}")
        try:
            return self.take(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise _error(self.path, f"{what} is not UTF-8 text") from None


_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class _LongArray:
    """An array value that was checked and skipped; only its length is kept."""

    length: int


def _value_type(cursor: _Cursor, raw_type: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw_type)
    except ValueError:
        raise _error(cursor.path, f"metadata {key!r} has unknown value type {raw_type}") from None


def _read_value(cursor: _Cursor, raw_type: int, key: str) -> Any:
    """Read one value; arrays longer than ``MAX_KEPT_ARRAY`` come back as ``_LongArray``."""
    kind = _value_type(cursor, raw_type, key)
    if kind in SCALAR_FORMATS:
        return cursor.unpack(SCALAR_FORMATS[kind], f"metadata {key!r}")
    if kind == GGUFValueType.STRING:
        return cursor.string(f"metadata {key!r}")
    return _read_array(cursor, key)


def _read_array(cursor: _Cursor, key: str) -> list[Any] | _LongArray:
    item_type = cursor.unpack("<I", f"the item type of {key!r}")
    count = cursor.unpack("<Q", f"the length of {key!r}")
    scalar_format = SCALAR_FORMATS.get(_value_type(cursor, item_type, key))
    smallest_item = struct.calcsize(scalar_format) if scalar_format else 8  # a string's length field
    if count * smallest_item > cursor.remaining:
        raise _error(cursor.path, f"metadata {key!r} claims {count} items, more than the file can hold")
    if count > MAX_ARRAY_ITEMS:
        raise _error(
            cursor.path, f"metadata {key!r} claims {count} items, more than the {MAX_ARRAY_ITEMS} Hearth reads"
        )
    if count <= MAX_KEPT_ARRAY:
        return [_read_value(cursor, item_type, key) for _ in range(count)]
    if scalar_format:
        cursor.take(count * smallest_item, f"metadata {key!r}")
    elif item_type == GGUFValueType.STRING:
        cursor.skip_strings(count, f"metadata {key!r}")
    else:
        for _ in range(count):
            _read_value(cursor, item_type, key)
    return _LongArray(count)


def _read_header(cursor: _Cursor) -> tuple[int, int, int]:
    """Return version, tensor count and key/value count, each checked against the file size."""
    if cursor.take(4, "the magic number") != GGUF_MAGIC:
        raise _error(cursor.path, "it does not start with the GGUF magic bytes", "Pick a real .gguf model file.")
    version = cursor.unpack("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        raise _error(
            cursor.path,
            f"it is GGUF version {version} (Hearth reads versions 2 and 3, little-endian)",
            "Convert it again with a current llama.cpp.",
        )
    tensor_count = cursor.unpack("<Q", "the tensor count")
    kv_count = cursor.unpack("<Q", "the metadata count")
    needed = tensor_count * MIN_TENSOR_INFO_BYTES + kv_count * MIN_KV_BYTES
    if needed > cursor.remaining:
        raise _error(
            cursor.path,
            f"its header claims {tensor_count} tensors and {kv_count} metadata entries, "
            f"which cannot fit in a file of {len(cursor.buffer)} bytes",
        )
    return version, tensor_count, kv_count


def _read_metadata(cursor: _Cursor, kv_count: int) -> tuple[dict[str, Any], dict[str, int]]:
    """Return the kept values and, for every array, its length."""
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(kv_count):
        key = cursor.string("a metadata key")
        value = _read_value(cursor, cursor.unpack("<I", f"the type of {key!r}"), key)
        if key in metadata or key in array_lengths:
            raise _error(cursor.path, f"metadata {key!r} appears twice")
        if isinstance(value, _LongArray):
            array_lengths[key] = value.length
            continue
        if isinstance(value, list):
            array_lengths[key] = len(value)
        metadata[key] = value
    return metadata, array_lengths


def _read_tensor_info(cursor: _Cursor) -> GGUFTensorInfo:
    name = cursor.string("a tensor name")
    n_dims = cursor.unpack("<I", f"the dimensions of {name!r}")
    if n_dims > MAX_DIMS:
        raise _error(cursor.path, f"tensor {name!r} claims {n_dims} dimensions (at most {MAX_DIMS})")
    dims = [cursor.unpack("<Q", f"the shape of {name!r}") for _ in range(n_dims)]
    raw_type = cursor.unpack("<I", f"the type of {name!r}")
    offset = cursor.unpack("<Q", f"the offset of {name!r}")
    try:
        quant_type = GGMLQuantizationType(raw_type)
        block_size, type_size = GGML_QUANT_SIZES[quant_type]
    except (ValueError, KeyError):
        raise _error(
            cursor.path, f"tensor {name!r} has unknown type {raw_type}", "Update Hearth or pick another file."
        ) from None
    n_elements = 1
    for size in dims:
        n_elements *= size
    if dims and dims[0] % block_size:
        raise _error(cursor.path, f"tensor {name!r} has a row size not divisible by its block size")
    return GGUFTensorInfo(name, quant_type, n_elements, n_elements * type_size // block_size, offset, tuple(dims))


def _data_start(cursor: _Cursor, metadata: dict[str, Any]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _error(cursor.path, f"general.alignment is {alignment!r}, not a power of two")
    return -(-cursor.position // alignment) * alignment


def _check_tensor_layout(path: Path, tensors: list[GGUFTensorInfo], data_bytes: int) -> None:
    names: set[str] = set()
    end_so_far, previous = 0, ""
    for tensor in sorted(tensors, key=lambda t: t.offset):
        if tensor.name in names:
            raise _error(path, f"tensor {tensor.name!r} appears twice")
        names.add(tensor.name)
        if tensor.offset + tensor.n_bytes > data_bytes:
            raise _error(
                path,
                f"tensor {tensor.name!r} ends {tensor.offset + tensor.n_bytes - data_bytes} bytes "
                f"past the end of the file (it is truncated)",
            )
        if tensor.offset < end_so_far:
            raise _error(path, f"tensors {previous!r} and {tensor.name!r} overlap")
        end_so_far, previous = tensor.offset + tensor.n_bytes, tensor.name


def read_gguf(path: Path) -> GGUFContents:
    """Walk and check ``path``; raise ``ModelFileError`` saying what is wrong."""
    with path.open("rb") as handle:
        if path.stat().st_size < HEADER_BYTES:
            raise _error(path, "it is too short to hold a GGUF header", "Pick a real .gguf model file.")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            cursor = _Cursor(path, buffer)
            version, tensor_count, kv_count = _read_header(cursor)
            metadata, array_lengths = _read_metadata(cursor, kv_count)
            tensors = [_read_tensor_info(cursor) for _ in range(tensor_count)]
            data_start = _data_start(cursor, metadata)
            _check_tensor_layout(path, tensors, len(buffer) - data_start)
    return GGUFContents(version, metadata, array_lengths, tuple(tensors), data_start)


def file_type_name(metadata: dict[str, Any]) -> str | None:
    """``general.file_type`` as llama.cpp names it (e.g. "MOSTLY_Q4_1"), if present."""
    value = metadata.get("general.file_type")
    try:
        return LlamaFileType(value).name if value is not None else None
    except ValueError:
        return f"unknown ({value})"


@contextmanager
def explain_gguf_errors(path: Path) -> Iterator[None]:
    """Turn an exception from the ``gguf`` package (or a loader using it) into a ``ModelFileError``.

    Use it around any call that makes ``gguf.GGUFReader`` read ``path``, after
    ``read_gguf(path)`` has accepted the file.
    """
    try:
        yield
    except (ValueError, KeyError, IndexError, struct.error, OSError) as error:
        raise _error(path, f"the gguf reader failed: {error}") from error


# The tensor types Hearth reads (``engine.forward.weights.gguf_blocks``): 4-bit blocks straight into its int4
# groups, Q5_K, Q6_K and Q8_0 through ``gguf_codes``, MXFP4 (gpt-oss's experts) kept as it is
# (``weights.mxfp4``), the rest through ``gguf.quants`` into floats. The IQ and ternary types are not among them.
READABLE_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                 "MXFP4")
)
PLAIN_TYPES = frozenset((GGMLQuantizationType.F16, GGMLQuantizationType.BF16, GGMLQuantizationType.F32))  # unquantized


def refuse_unreadable_types(path: Path, contents: GGUFContents) -> None:
    """Raise ``ModelFileError`` naming the tensor types of ``contents`` that Hearth cannot read, if any."""
    unreadable = sorted({tensor.quant_type.name for tensor in contents.tensors} - {t.name for t in READABLE_TYPES})
    if unreadable:
        readable = ", ".join(sorted(t.name for t in READABLE_TYPES))
        raise _error(
            path, f"it stores tensors as {', '.join(unreadable)}, which Hearth cannot read (it reads {readable})",
            "Pick a file of one of those types (Q4_K_M, say).",
        )


# GGUF architectures read tensor by tensor into the fast path (``gguf_direct``), by their model_type there;
# the others go through transformers, which dequantizes the whole file into fp32 first.
DIRECT_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                        "gemma3": "gemma3_text", "phi3": "phi3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
                        "granite": "granite", "gpt-oss": "gpt_oss"}


# Per-architecture metadata keys ("{arch}.KEY") copied into ``ModelSource.config``.
GGUF_CONFIG_KEYS = {
    "context_length": "context_length",
    "block_count": "block_count",
    "embedding_length": "embedding_length",
    "feed_forward_length": "feed_forward_length",
    "head_count": "attention.head_count",
    "head_count_kv": "attention.head_count_kv",
    "key_length": "attention.key_length",
    "vocab_size": "vocab_size",
    "expert_count": "expert_count",
    "expert_used_count": "expert_used_count",
    "expert_feed_forward_length": "expert_feed_forward_length",
    "expert_shared_feed_forward_length": "expert_shared_feed_forward_length",
}


def gguf_config(path: Path, contents: GGUFContents) -> dict[str, Any]:
    """The architecture metadata of a checked GGUF file, under short names."""
    architecture = contents.metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise _error(path, "it does not say which architecture it holds (general.architecture)")
    config: dict[str, Any] = {"architecture": architecture}
    for name, key in GGUF_CONFIG_KEYS.items():
        value = contents.metadata.get(f"{architecture}.{key}")
        if value is not None:
            config[name] = value
    config.setdefault("vocab_size", contents.array_lengths.get("tokenizer.ggml.tokens"))
    _check_shape_numbers(path, config)
    _check_vocabulary(path, contents, config)
    if architecture in DIRECT_ARCHITECTURES and _is_whole(config.get("block_count")):
        config["layer_windows"] = _layer_windows(path, contents.metadata, architecture, config["block_count"])
    config["file_type"] = file_type_name(contents.metadata)
    config["model_name"] = contents.metadata.get("general.name")
    config["tied_embeddings"] = all(tensor.name != "output.weight" for tensor in contents.tensors)
    return config


SLIDING_PATTERNS = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2}
"""Every n-th layer of these architectures attends to the whole context and the others through the sliding window,
as llama.cpp sets them where a file does not say (``attention.sliding_window_pattern``)."""


def window_fields(metadata: dict[str, Any], architecture: str, layers: int) -> dict[str, Any]:
    """The fields of a Hugging Face config that say which of the ``layers`` layers of a GGUF file's model attend
    through a sliding window (``windows.layer_windows`` reads them): ``sliding_window``, the file's window, and for
    ``SLIDING_PATTERNS``' architectures ``layer_types``, from the file's pattern (a period, or a flag a layer) or
    else llama.cpp's. Raises ``ValueError`` naming a metadata value that is neither."""
    window = metadata.get(f"{architecture}.attention.sliding_window")
    if window is not None and not (_is_whole(window) and window >= 0):  # Phi-3's files say 0 for none
        raise ValueError(f"its metadata {architecture}.attention.sliding_window is {window!r}, not a number of "
                         "tokens")
    fields: dict[str, Any] = {"sliding_window": window or None}
    if architecture not in SLIDING_PATTERNS:
        return fields
    key = f"{architecture}.attention.sliding_window_pattern"
    pattern = metadata.get(key, SLIDING_PATTERNS[architecture])
    if isinstance(pattern, list) and len(pattern) == layers and all(isinstance(flag, bool) for flag in pattern):
        sliding = pattern
    elif _is_whole(pattern) and pattern > 0:
        sliding = [(index + 1) % pattern != 0 for index in range(layers)]
    else:
        raise ValueError(f"its metadata {key} is {pattern!r}, neither a period nor a flag for each of its {layers} "
                         "layers")
    fields["layer_types"] = [SLIDING if slides else FULL for slides in sliding]
    return fields


def _layer_windows(path: Path, metadata: dict[str, Any], architecture: str, layers: int) -> list[int | None]:
    """Each layer's window in tokens (``None``: the whole context) as the fast path will hold it, for the memory
    estimate: ``layer_windows`` of ``window_fields`` under the architecture's ``model_type``."""
    try:
        fields = window_fields(metadata, architecture, layers)
    except ValueError as problem:
        raise _error(path, str(problem)) from None
    config = SimpleNamespace(num_hidden_layers=layers, model_type=DIRECT_ARCHITECTURES[architecture], **fields)
    return list(layer_windows(config))


def _check_shape_numbers(path: Path, config: dict[str, Any]) -> None:
    """Layer, width and head counts must be positive, and the heads must split the width and each other."""
    architecture = config["architecture"]
    for name in POSITIVE_KEYS:
        value = config.get(name)
        if value is not None and (not _is_whole(value) or value <= 0):
            key = f"{architecture}.{GGUF_CONFIG_KEYS[name]}"
            raise _error(path, f"its metadata {key} is {value!r}, not a positive number")
    heads, kv_heads, width = config.get("head_count"), config.get("head_count_kv"), config.get("embedding_length")
    if kv_heads is not None and _is_whole(heads) and (not _is_whole(kv_heads) or kv_heads <= 0 or heads % kv_heads):
        raise _error(path, f"its {kv_heads!r} key/value heads do not divide its {heads} attention heads")
    if config.get("key_length") is None and _is_whole(heads) and _is_whole(width) and width % heads:
        raise _error(path, f"its width {width} does not split into {heads} attention heads")


def _check_vocabulary(path: Path, contents: GGUFContents, config: dict[str, Any]) -> None:
    """A token table (and ``vocab_size``) with a row for every token of the vocabulary."""
    tokens = contents.array_lengths.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    vocab_size = config.get("vocab_size")
    if vocab_size is not None and (not _is_whole(vocab_size) or vocab_size < tokens):
        raise _error(path, f"its vocab_size {vocab_size!r} is smaller than its tokenizer's {tokens} tokens")
    for tensor in contents.tensors:
        if tensor.name in ("token_embd.weight", "output.weight") and len(tensor.dims) == 2 and tensor.dims[1] < tokens:
            raise _error(path, f"its {tensor.name} has {tensor.dims[1]} rows for the tokenizer's {tokens} tokens")


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
