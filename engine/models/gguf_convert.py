"""Converts a GGUF file once into a cached Hugging Face folder (engine thread).

transformers dequantizes GGUF weights and re-parses the tokenizer on every load,
which takes tens of seconds. We do it once, write config, tokenizer and safetensors
weights into the cache, and load that folder from then on. A conversion is written
to a temporary folder and renamed into place, so a crash never leaves half a cache.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from engine.host import paths
from engine.models.weight_progress import TensorProgress, report_tensors

_DONE_MARKER = "hearth-converted.json"
FORMAT_VERSION = 1


def converted_dir_for(gguf_path: Path) -> Path:
    """Where the converted copy of ``gguf_path`` lives; keyed by name, size and modification time."""
    stat = gguf_path.stat()
    key = f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{FORMAT_VERSION}"
    return paths.models_dir() / "converted" / key


def is_converted(folder: Path) -> bool:
    return (folder / _DONE_MARKER).is_file()


def convert_gguf(gguf_path: Path, report: TensorProgress = lambda done, total: None) -> Path:
    """The converted folder for ``gguf_path``, converting first if needed.

    ``report`` counts tensors as they are converted; raising from it abandons the
    conversion and leaves no partial folder behind.
    """
    target = converted_dir_for(gguf_path)
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        with report_tensors(report):
            _write_converted(gguf_path, staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_converted(gguf_path: Path, folder: Path) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights we write are plain floats
    config["_name_or_path"] = gguf_path.stem
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(folder / "model.safetensors"))  # handles tied embeddings
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    (folder / _DONE_MARKER).write_text(json.dumps({"source": str(gguf_path), "format": FORMAT_VERSION}))
