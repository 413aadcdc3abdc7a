"""From what the user picked to a loaded model (engine thread).

"default" is fetched first if needed; a GGUF file is converted once into a cached
folder; then the folder is loaded. Every failure becomes a ``ModelOpenError`` whose
message says what is wrong, where, and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from engine import default_model, gguf_convert
from engine.loading import LoadedModel, Progress, load_model
from engine.messages import FetchProgress, LoadOptions, StatusChanged
from engine.worker import EventSink


class ModelOpenError(Exception):
    """The model cannot be opened; the message is meant for the user."""


def open_model(
    requested: str,
    options: LoadOptions,
    emit: EventSink,
    progress: Progress,
    is_cancelled: Callable[[], bool],
) -> LoadedModel:
    path = _fetch_if_default(requested, emit, is_cancelled)
    if not path.exists():
        raise ModelOpenError(f"{path} does not exist. Pick a model folder or a .gguf file.")
    name = path.stem if path.is_file() else path.name
    folder = _as_folder(path, emit)
    emit(StatusChanged("loading", f"Loading {name}…"))
    return load_model(folder, name, options, progress, is_cancelled)


def _fetch_if_default(requested: str, emit: EventSink, is_cancelled: Callable[[], bool]) -> Path:
    if requested != "default":
        return Path(requested).expanduser()
    if default_model.is_default_model_present():
        return default_model.default_model_path()
    emit(StatusChanged("fetching", "Downloading the built-in model (SmolLM2-135M-Instruct)…"))
    try:
        return default_model.fetch_default_model(lambda done, total: emit(FetchProgress(done, total)), is_cancelled)
    except default_model.DefaultModelUnavailable as exc:
        raise ModelOpenError(str(exc)) from exc


def _as_folder(path: Path, emit: EventSink) -> Path:
    if path.is_dir():
        return path
    if path.suffix.lower() != ".gguf":
        raise ModelOpenError(f"{path.name} is neither a model folder nor a .gguf file.")
    if not gguf_convert.is_converted(gguf_convert.converted_dir_for(path)):
        emit(StatusChanged("loading", f"Converting {path.name} (first time only)…"))
    return gguf_convert.convert_gguf(path)
