"""What a benchmark's ``--model`` names, and opening it as the engine does (main thread of a benchmark).

``default``, a path, ``random:NAME`` (a transformers model with random weights,
``random_models``), ``random-gguf:SHAPE:TYPE`` (a GGUF file with random weights,
written on first use, ``random_gguf``) or ``random-hf:SHAPE:DTYPE`` (a safetensors
folder with random weights, likewise, ``random_hf``). Files go through the public loading entry,
``open_model``, so a benchmark measures whichever loader is in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.bench.random_gguf import ensure_random_gguf, is_random_gguf
from engine.bench.random_hf import ensure_random_hf, is_random_hf
from engine.models import default_model
from engine.models.loading import LoadedModel, resolve_device
from engine.models.model_open import open_model
from engine.models.random_models import is_random, load_random
from engine.protocol.messages import PRECISIONS, LoadOptions


def resolve_model(model: str) -> str:
    """``model`` with a ``random-gguf:`` or ``random-hf:`` name replaced by its file or folder, written first if
    needed (their tokenizer is the built-in model's)."""
    if is_random_gguf(model):
        return str(ensure_random_gguf(model, default_model.fetch_default_model()))
    if is_random_hf(model):
        return str(ensure_random_hf(model, default_model.fetch_default_model()))
    return model


def gguf_file(model: str) -> Path:
    """The GGUF file that llama.cpp should load for ``model``; a clear error for anything else."""
    if model == "default":
        return default_model.fetch_default_model()
    resolved = Path(resolve_model(model)).expanduser()
    if is_random(model) or resolved.suffix.lower() != ".gguf" or not resolved.is_file():
        raise ValueError(f"The llama.cpp baseline needs a GGUF file; {model!r} is not one "
                         "(use default, a .gguf path, or random-gguf:SHAPE:TYPE).")
    return resolved


def open_bench_model(model: str, device: str, quant: str, draft_model: str | None = None) -> LoadedModel:
    """The model as the engine loads it: same precision choice, same backend. ``quant``: "none" (the device's
    full precision) or a precision by name (``PRECISIONS``). ``draft_model``: a model to draft for it, named as
    ``model`` is (``LoadOptions.draft_model``)."""
    chosen = resolve_device(device)
    precision = quant if quant in PRECISIONS else ("bf16" if chosen.type == "cuda" else "fp32")
    if is_random(model):
        return load_random(model, chosen.type, precision)
    draft = resolve_model(draft_model) if draft_model is not None else None
    options = LoadOptions(chosen.type, precision, draft_model=draft)
    return open_model(resolve_model(model), options, _ignore, _ignore, lambda: False)


def _ignore(*_: Any) -> None:
    """Events and progress of a benchmark's load are not shown."""
