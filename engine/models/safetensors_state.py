"""A Hugging Face folder's safetensors weights, read one tensor when it is asked for (engine thread).

``SafetensorsState`` is the ``Mapping`` that ``FastLlama`` (and on a GPU ``CudaLlama``)
packs its weights from: each ``state[name]`` reads that tensor's bytes from its file,
in the file's dtype, and nothing is kept once it is handed over. A load therefore holds
the packed weights and the one tensor on its way into them (with its transient fp32
copy): never the folder's whole state, and never an fp32 copy of a bf16 model. On a GPU
each tensor goes to the device as soon as it is read, so host memory stays bounded by
the largest tensor.

The bytes are read (``tensor_reads.read_exactly``) straight into the tensor's own buffer rather than
through ``safetensors.safe_open``: ``safe_open`` maps the whole file, and every page of
it a ``get_tensor`` touched stays in the process's resident set (file-backed, but counted
in its peak) while the handle is open, beside the packed copy: a load's peak resident
memory would be the packed weights and most of the file besides, where read this way it
stays little above the packed weights.

Names, dtypes and byte ranges come from the headers ``model_files`` checked (the single
file or the shards the index lists); ``report`` counts the tensors read, and raises
``LoadCancelled`` between two of them when the user cancels (``loading.cancellable``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine.host.allocator import return_freed_memory
from engine.models.model_files import folder_weights
from engine.models.model_source import ModelFileError
from engine.models.safetensors_check import TensorEntry
from engine.models.tensor_reads import LazyTensors, read_exactly

Progress = Callable[[int, int], None]  # (tensors read, tensors in all)
TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class _Located:
    """Where one tensor's bytes lie: its file, and its byte range from the start of that file."""

    path: Path
    entry: TensorEntry
    start: int


class SafetensorsState(LazyTensors):
    """The folder's tensors by name, each read from its file when asked for (see the module docstring)."""

    def __init__(self, folder: Path, report: Progress) -> None:
        headers, _notes = folder_weights(folder)
        self._tensors = {
            entry.name: _Located(header.path, entry, header.data_start + entry.begin)
            for header in headers for entry in header.tensors
        }
        self._report, self._done = report, set[str]()

    def __getitem__(self, name: str) -> torch.Tensor:
        located = self._tensors[name]
        return_freed_memory()  # the previous tensor's temporaries, before this one's
        tensor = read_tensor(located.path, located.entry, located.start)
        self._done.add(name)
        self._report(len(self._done), len(self._tensors))
        return tensor


def read_tensor(path: Path, entry: TensorEntry, start: int) -> torch.Tensor:
    """The tensor ``entry`` of ``path``, its bytes read from offset ``start`` into a fresh CPU buffer."""
    if entry.dtype not in TORCH_DTYPES:
        raise ModelFileError(f"{path.name}: tensor {entry.name!r} is {entry.dtype}, which Hearth cannot load. ({path})")
    raw = torch.empty(entry.end - entry.begin, dtype=torch.uint8)  # [bytes]
    read_exactly(path, memoryview(raw.numpy()), start)
    return raw.view(TORCH_DTYPES[entry.dtype]).reshape(entry.shape)
