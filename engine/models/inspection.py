"""Answer ``InspectModel``: what a model is and how much memory it would need (engine thread).

The load dialog asks before loading. This module checks the path the way loading
does (``inspect_model``: metadata only, nothing executed or allocated), then
estimates memory for every precision the device can run, against the memory free
now, and says which precision ``auto`` would pick and the context a load would take
(``context_choice``: the one asked for, or the longest that fits up to 32 768 tokens). A draft model the
options name is counted beside it (``draft_pairing.draft_need``: its weights and its KV pool): the precision and the
context are chosen in the memory it leaves, and each estimate's total includes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from engine.models import default_model
from engine.models.context_choice import DEFAULT_CONTEXT_CAP, ContextChoice, choose_load
from engine.models.draft_pairing import NO_DRAFT, DraftNeed, draft_need
from engine.models.memory_estimate import NotEnoughMemoryError, available_memory, estimate, fit_verdict
from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError, ModelSource
from engine.protocol.messages import InspectFailed, InspectModel, LoadOptions, ModelInspected, PrecisionEstimate

PRECISIONS_ON = {"cuda": ("bf16", "fp16", "fp32", "int8", "int4"), "cpu": ("fp32", "bf16", "fp16", "int8", "int4")}
"""What each device offers (``format_plan``): on the CPU 8-bit is Hearth's int8 kernel, a Q8_0 file's blocks as they
are."""

MemoryProbe = Callable[[str], int]


def inspect_request(request: InspectModel) -> ModelInspected | InspectFailed:
    """The event that answers ``request``: the findings, or why the path was refused."""
    try:
        return inspect_for_dialog(request.path, request.options, request.request_id)
    except (ModelFileError, OSError, RuntimeError, ValueError) as error:
        return InspectFailed(request.request_id, str(error))


def inspect_for_dialog(
    path: str,
    options: LoadOptions,
    request_id: str = "",
    free_memory: MemoryProbe = available_memory,
    cuda_available: bool | None = None,
) -> ModelInspected:
    """Inspect ``path`` and estimate its memory on ``options.device`` for ``options.context_length`` tokens, its KV
    cache in ``options.kv_cache``, beside the draft model ``options.draft_model`` names (if any).

    ``free_memory`` and ``cuda_available`` default to this machine's; tests pass their own.
    Raises ``ModelFileError`` for a refused path, ``RuntimeError`` when CUDA is asked for but absent.
    """
    has_cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    device = _device(options.device, has_cuda)
    source = inspect_model(_model_path(path))
    available = {"cpu": free_memory("cpu"), "cuda": free_memory("cuda") if has_cuda else 0}
    draft, draft_notes = _draft_need(source, options, device, available[device])
    room = available[device] - draft.total_bytes
    auto_precision, context = _auto_choice(source, device, options.context_length, room, options.kv_cache)
    return ModelInspected(
        request_id=request_id,
        path=path,
        name=source.name,
        kind=source.kind,
        n_params=source.n_params,
        native_context_length=source.native_context,
        context_length=context.tokens,
        device=device,
        estimates=_estimates(source, device, context.tokens, room, options.kv_cache, draft),
        available_bytes_cpu=available["cpu"],
        available_bytes_cuda=available["cuda"],
        cuda_available=has_cuda,
        auto_precision=auto_precision,
        notes=source.notes + draft_notes,
        file_type=str(source.config.get("file_type") or "").removeprefix("MOSTLY_"),
        context_reason=context.reason if auto_precision else "",
        draft_weight_bytes=draft.weight_bytes,
        draft_kv_bytes=draft.kv_bytes,
        expert_format="MXFP4" if source.kept_expert_bytes is not None and device == "cpu" else "",
    )


def _draft_need(target: ModelSource, options: LoadOptions, device: str,
                available: int) -> tuple[DraftNeed, tuple[str, ...]]:
    """What the draft model of ``options`` would hold beside ``target``; nothing, and a note saying why, where it
    cannot be read or would not load at all."""
    if options.draft_model is None:
        return NO_DRAFT, ()
    try:
        draft = inspect_model(_model_path(options.draft_model))
        return draft_need(draft, target, options.context_length, device, available), ()
    except (ModelFileError, OSError) as error:
        return NO_DRAFT, (f"The draft model is not counted, and would not be used: {error}",)


def _auto_choice(source: ModelSource, device: str, context: int | None, available: int,
                 kv_cache: str) -> tuple[str | None, ContextChoice]:
    """What ``auto`` would load: its precision and context, or None and the context asked (else the default's)
    when nothing fits."""
    try:
        return choose_load(source, device, "auto", context, available, kv_cache)
    except NotEnoughMemoryError:
        tokens = context or min(DEFAULT_CONTEXT_CAP, source.native_context)
        return None, ContextChoice(tokens, source.native_context, available, asked=context is not None)


def _device(requested: str, has_cuda: bool) -> str:
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    if requested == "cuda" and not has_cuda:
        raise RuntimeError("CUDA was requested, but no CUDA GPU is available to PyTorch on this machine. Pick CPU.")
    if requested not in PRECISIONS_ON:
        raise ValueError(f"Unknown device {requested!r}: pick auto, cuda or cpu.")
    return requested


def _model_path(requested: str) -> Path:
    if requested != "default":
        return Path(requested).expanduser()
    if not default_model.is_default_model_present():
        raise ModelFileError("The built-in model is not downloaded yet; load it once and it will be kept.")
    return default_model.default_model_path()


def _estimates(source: ModelSource, device: str, context_length: int, room: int, kv_cache: str,
               draft: DraftNeed) -> tuple[PrecisionEstimate, ...]:
    """Each precision's estimate, its total with ``draft`` and its verdict against the ``room`` the draft leaves."""
    found = []
    for precision in PRECISIONS_ON[device]:
        needed = estimate(source, precision, context_length, device, kv_cache)
        verdict = fit_verdict(needed.total_bytes, room)
        found.append(PrecisionEstimate(precision, needed.weight_bytes, needed.kv_bytes,
                                       needed.total_bytes + draft.total_bytes, verdict))
    return tuple(found)
