"""From what the user picked to a loaded model (engine thread).

"default" is fetched first if needed. Every path is inspected before anything is
allocated (``model_files``): a file Hearth refuses raises ``ModelFileError`` with a
message for the user. Then ``context_choice`` picks or checks the precision and the
context together (the user's, or the longest that fits comfortably up to 32 768
tokens, never past the trained length; the KV pool is sized from it), its
``FormatPlan`` is chosen once (``format_plan``), and the folder or GGUF file is loaded
in it (``loading``). A draft model the options name is read first: its weights and KV pool
(``draft_pairing.draft_need``) are kept out of the memory the model's precision and context are chosen in, so a model
that fits only without its draft model is refused with the figures. The draft model loads after the model, the
same way, and pairs with it where it can draft for it (``draft_pairing``). Earlier versions kept a
converted copy of each GGUF file in the models cache; the first load removes them and
says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from engine.chat.chat_template import ChatTemplate
from engine.host import paths
from engine.models import default_model, memory_estimate
from engine.models.gguf_check import explain_gguf_errors
from engine.models.format_plan import FormatPlan, formats_for_source, four_bit_prompts_faster, traits_of
from engine.models.context_choice import ContextChoice, choose_load, kv_budget_bytes
from engine.models.draft_pairing import draft_need, draft_not_used, target_refused, with_draft
from engine.models.loading import LoadedModel, LoadPlan, Progress, load_model, resolve_device
from engine.models.memory_estimate import NotEnoughMemoryError, cpu_formats_notice, gib_text
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
    """The model ``requested`` loaded under ``options``, with its draft model where ``options`` names one that can
    draft for it (``draft_pairing``; one that cannot leaves a notice saying why)."""
    if options.draft_model is None:
        return _open_one(requested, options, emit, progress, is_cancelled)
    loaded = _open_one(requested, options, emit, progress, is_cancelled,
                       _draft_source(options.draft_model, emit, is_cancelled))
    name = "the built-in model" if options.draft_model == "default" else options.draft_model
    refused = target_refused(loaded)
    if refused is not None:
        return draft_not_used(loaded, name, refused)
    draft_options = LoadOptions(device=loaded.device)  # its own precision and context, chosen as for any load
    try:
        draft = _open_one(options.draft_model, draft_options, emit, progress, is_cancelled)
    except (ModelFileError, OSError, RuntimeError, ValueError, MemoryError) as exc:  # the model itself loaded
        return draft_not_used(loaded, name, str(exc) or type(exc).__name__)
    return with_draft(loaded, draft)


def _open_one(
    requested: str,
    options: LoadOptions,
    emit: EventSink,
    progress: Progress,
    is_cancelled: Callable[[], bool],
    draft: ModelSource | None = None,
) -> LoadedModel:
    """One model loaded under ``options``, its precision and context chosen in the memory ``draft`` (the draft model
    to load after it, if any) leaves."""
    path = _fetch_if_default(requested, emit, is_cancelled)
    source = inspect_model(path)
    device = resolve_device(options.device)
    requested = canonical_precision(options.precision)
    available = memory_estimate.available_memory(device.type)  # one reading for the precision and the context
    precision, context = _choose_beside_draft(source, device.type, requested, options, available, draft)
    formats = _plan_formats(source, device.type, requested, precision, options.kv_cache)
    notice = _formats_notice(source, requested, formats, context.tokens, available)
    template = ChatTemplate.for_model(source)
    emit(StatusChanged("loading", f"Loading {source.name} on {device.type}…"))
    plan = LoadPlan(
        source.path, source.name, device, formats.precision, context.tokens, template,
        _notices(source, template) + remove_converted_copies() + notice + _context_notice(context)
        + ((formats.kv_notice,) if formats.kv_notice else ()),
        four_bit_source=source.four_bit_layers, formats=formats, eight_bit_source=source.eight_bit_layers,
        kv_budget_bytes=kv_budget_bytes(source, formats, context.tokens), context_reason=context.reason,
    )
    if source.kind != "gguf":
        return load_model(plan, progress, is_cancelled)
    with explain_gguf_errors(source.path):
        return load_model(plan, progress, is_cancelled)


def _draft_source(requested: str, emit: EventSink, is_cancelled: Callable[[], bool]) -> ModelSource | None:
    """The draft model's checked headers (the built-in model fetched first); None where it cannot be read, which its
    own load, after the model's, then says."""
    try:
        return inspect_model(_fetch_if_default(requested, emit, is_cancelled))
    except (ModelFileError, OSError):
        return None


def _choose_beside_draft(source: ModelSource, device: str, requested: str, options: LoadOptions, available: int,
                         draft: ModelSource | None) -> tuple[str, ContextChoice]:
    """``choose_load`` in the memory the draft model's weights and pool leave; its refusal then says what the draft
    model takes. A draft model that would not load at all takes nothing (its own load says so)."""
    try:
        reserved = draft_need(draft, source, options.context_length, device, available).total_bytes if draft else 0
    except NotEnoughMemoryError:
        reserved = 0
    try:
        return choose_load(source, device, requested, options.context_length, available - reserved,
                           options.kv_cache)
    except NotEnoughMemoryError as exc:
        if not reserved:
            raise
        raise NotEnoughMemoryError(
            f"{exc} The draft model takes {gib_text(reserved)} of the {gib_text(available)} free (its weights and "
            f"its KV cache): without one, the model has that much more room."
        ) from exc


def _plan_formats(source: ModelSource, device: str, requested: str, precision: str, kv_cache: str) -> FormatPlan:
    """The load's formats at ``precision`` with ``kv_cache`` (with the reason, when ``auto`` ran a 4-bit file from
    its int4 weights alone on the CPU's fast path)."""
    formats = formats_for_source(source, device, precision, kv_cache=kv_cache)
    if requested != "auto" or not formats.fast_path or device != "cpu" or precision != "int4":
        return formats
    faster = four_bit_prompts_faster(traits_of(source), formats.host)
    return formats_for_source(source, device, precision, "int4 prompts run faster here" if faster else "fp16 did not fit",
                              kv_cache)


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


def _formats_notice(source: ModelSource, requested: str, formats: FormatPlan, context_length: int,
                    available: int) -> tuple[str, ...]:
    """The load notice saying which formats ``auto`` chose on the CPU and why (memory), if it chose."""
    if requested != "auto" or formats.device != "cpu":
        return ()
    notice = cpu_formats_notice(source, formats, context_length, available)
    return (notice,) if notice else ()


def _context_notice(context: ContextChoice) -> tuple[str, ...]:
    """The load notice saying which context was chosen and why, when it is shorter than the trained one."""
    return (f"Context: {context.reason}.",) if context.tokens < context.trained else ()


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
