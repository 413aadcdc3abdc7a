"""What a benchmark's ``--model`` names, and opening it as the engine does (main thread of a benchmark).

``default``, a path, ``random:NAME`` (a transformers model with random weights,
``random_models``) or ``random-gguf:SHAPE:TYPE`` (a GGUF file with random weights,
written on first use, ``random_gguf``). Files go through the public loading entry,
``open_model``, so a benchmark measures whichever loader is in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.bench.random_gguf import ensure_random_gguf, is_random_gguf
from engine.models import default_model
from engine.models.loading import LoadedModel, resolve_device
from engine.models.model_open import open_model
from engine.models.random_models import is_random, load_random
from engine.protocol.messages import LoadOptions

QUANT_PRECISION = {"int8": "int8", "nf4": "nf4", "auto": "auto"}


def resolve_model(model: str) -> str:
    """``model`` with a ``random-gguf:`` name replaced by its file, written first if needed."""
    if not is_random_gguf(model):
        return model
    return str(ensure_random_gguf(model, default_model.fetch_default_model()))  # its tokenizer is the built-in one


def gguf_file(model: str) -> Path:
    """The GGUF file that llama.cpp should load for ``model``; a clear error for anything else."""
    if model == "default":
        return default_model.fetch_default_model()
    resolved = Path(resolve_model(model)).expanduser()
    if is_random(model) or resolved.suffix.lower() != ".gguf" or not resolved.is_file():
        raise ValueError(f"The llama.cpp baseline needs a GGUF file; {model!r} is not one "
                         "(use default, a .gguf path, or random-gguf:SHAPE:TYPE).")
    return resolved


def open_bench_model(model: str, device: str, quant: str) -> LoadedModel:
    """The model as the engine loads it: same precision choice, same backend."""
    chosen = resolve_device(device)
    precision = QUANT_PRECISION.get(quant) or ("bf16" if chosen.type == "cuda" else "fp32")
    if is_random(model):
        return load_random(model, chosen.type, precision)
    return open_model(resolve_model(model), LoadOptions(chosen.type, precision), _ignore, _ignore, lambda: False)


def _ignore(*_: Any) -> None:
    """Events and progress of a benchmark's load are not shown."""
