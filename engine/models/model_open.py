"""From what the user picked to a loaded model (engine thread).

"default" is fetched first if needed. Every path is inspected before anything is
allocated (``model_files``): a file Hearth refuses raises ``ModelFileError`` with a
message for the user. Then the memory estimate picks or checks the precision, its
``FormatPlan`` is chosen once (``format_plan``), and the folder or GGUF file is loaded
in it (``loading``). Earlier versions kept a converted
copy of each GGUF file in the models cache; the first load removes them and says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from engine.chat.chat_template import ChatTemplate
from engine.host import paths
from engine.models import default_model
from engine.models.gguf_check import explain_gguf_errors
from engine.models.format_plan import FormatPlan, formats_for_source, four_bit_prompts_faster, traits_of
from engine.models.loading import LoadedModel, LoadPlan, Progress, load_model, resolve_device
from engine.models.memory_estimate import (
    NotEnoughMemoryError,
    available_memory,
    choose_precision,
    cpu_formats_notice,
    estimate,
    fit_verdict,
)
from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError, ModelSource
from engine.protocol.channels import EventSink
from engine.protocol.messages import FetchProgress, LoadOptions, StatusChanged, canonical_precision

CONVERTED_FOLDER = "converted"  # under the models cache, where earlier versions kept converted GGUF files


def open_model(
    requested: str,
    options: LoadOptions,
    emit: EventSink,
    progress: Progress,
    is_cancelled: Callable[[], bool],
) -> LoadedModel:
    path = _fetch_if_default(requested, emit, is_cancelled)
    source = inspect_model(path)
    device = resolve_device(options.device)
    context_length = options.context_length or source.native_context
    requested = canonical_precision(options.precision)
    formats = _plan_formats(source, device.type, requested, context_length)
    notice = _formats_notice(source, requested, formats, context_length)
    template = ChatTemplate.for_model(source)
    emit(StatusChanged("loading", f"Loading {source.name} on {device.type}…"))
    plan = LoadPlan(
        source.path, source.name, device, formats.precision, context_length, template,
        _notices(source, template) + remove_converted_copies() + notice,
        four_bit_source=source.four_bit_layers, formats=formats,
    )
    if source.kind != "gguf":
        return load_model(plan, progress, is_cancelled)
    with explain_gguf_errors(source.path):
        return load_model(plan, progress, is_cancelled)


def _plan_formats(source: ModelSource, device: str, requested: str, context_length: int) -> FormatPlan:
    """The load's formats: ``requested``'s, or under ``auto`` the best precision that fits (with the reason, when
    ``auto`` ran a 4-bit file from its int4 weights alone on the CPU's fast path)."""
    precision = _pick_precision(source, device, requested, context_length)
    formats = formats_for_source(source, device, precision)
    if requested != "auto" or not formats.fast_path or device != "cpu" or precision != "int4":
        return formats
    faster = four_bit_prompts_faster(traits_of(source), formats.host)
    return formats_for_source(source, device, precision, "int4 prompts run faster here" if faster else "fp16 did not fit")


def _fetch_if_default(requested: str, emit: EventSink, is_cancelled: Callable[[], bool]) -> Path:
    if requested != "default":
        return Path(requested).expanduser()
    if default_model.is_default_model_present():
        return default_model.default_model_path()
    emit(StatusChanged("fetching", "Downloading the built-in model (SmolLM2-135M-Instruct)…"))
    try:
        return default_model.fetch_default_model(lambda done, total: emit(FetchProgress(done, total)), is_cancelled)
    except default_model.DefaultModelUnavailable as exc:
        raise ModelFileError(str(exc)) from exc


def _pick_precision(source: ModelSource, device: str, requested: str, context_length: int) -> str:
    """``auto`` takes the best precision that fits; an explicit one is refused if it cannot fit."""
    if requested == "auto":
        return choose_precision(source, device, context_length)
    needed = estimate(source, requested, context_length, device)
    available = available_memory(device)
    if fit_verdict(needed.total_bytes, available) == "won't fit":
        raise NotEnoughMemoryError(
            f"{source.name} at {requested} needs about {needed.total_bytes / 1024**3:.2f} GiB on {device} "
            f"(weights and a {context_length}-token KV cache), but only {available / 1024**3:.2f} GiB is free. "
            "Pick a smaller precision, a shorter context, or close other programs."
        )
    return requested


def _formats_notice(source: ModelSource, requested: str, formats: FormatPlan, context_length: int) -> tuple[str, ...]:
    """The load notice saying which formats ``auto`` chose on the CPU and why (memory), if it chose."""
    if requested != "auto" or formats.device != "cpu":
        return ()
    notice = cpu_formats_notice(source, formats, context_length, available_memory("cpu"))
    return (notice,) if notice else ()


def remove_converted_copies() -> tuple[str, ...]:
    """Delete the converted GGUF copies earlier versions cached; a notice saying so, once (when there were any)."""
    folder = paths.models_dir() / CONVERTED_FOLDER
    if not folder.is_dir():
        return ()
    freed = sum(entry.stat().st_size for entry in folder.rglob("*") if entry.is_file())
    shutil.rmtree(folder, ignore_errors=True)
    return (
        f"Removed the converted copies of GGUF files that earlier versions of Hearth kept ({freed / 1024**2:.0f} MB "
        f"in {folder}): GGUF files are now read as they are.",
    )


def _notices(source: ModelSource, template: ChatTemplate) -> tuple[str, ...]:
    return source.notes + ((template.notice,) if template.notice else ())
