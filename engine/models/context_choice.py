"""How many tokens of context a load gets, and the precision that goes with it (engine thread; no torch).

``choose_load`` is the one place this is decided; the loader (``model_open``) and the load dialog's estimate
(``inspection``) both call it. Llama 3.1 and Mistral-Nemo state a trained context of 131 072 and 1 024 000 tokens:
a KV cache that long would not fit beside the weights on most machines, and a chat rarely needs it. So unless the
user names a context, a load takes the longest that fits comfortably (``fit_verdict``'s "fits") in the memory left
after the weights, at the KV dtype its ``FormatPlan`` keeps, up to ``DEFAULT_CONTEXT_CAP`` and never past the
trained length. A model is refused only when even ``MIN_CONTEXT`` tokens do not fit beside its weights.

The KV block pool holds at least the chosen context (``kv_budget_bytes``), which the estimate counts; it
takes more only from memory that is spare once the weights are in (``host.memory.kv_pool_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.format_plan import FormatPlan, formats_for_source
from engine.models.memory_estimate import (
    NotEnoughMemoryError,
    choose_precision,
    estimate,
    estimate_formats,
    fit_verdict,
    gib_text,
    not_enough_memory,
)
from engine.models.model_source import ModelFileError, ModelSource

DEFAULT_CONTEXT_CAP = 32_768
"""The longest context a load takes unless the user asks for more: a long chat, at a KV cache most machines hold."""
MIN_CONTEXT = 2_048
"""The shortest context worth loading a model for; a model whose weights leave no room for it is refused."""
CONTEXT_STEP = 1_024
"""A context chosen by memory is a whole number of these (a figure the dialog's box steps by)."""


@dataclass(frozen=True)
class ContextChoice:
    """``tokens`` of context out of the ``trained`` length, chosen against ``available_bytes`` free, or named by
    the user (``asked``)."""

    tokens: int
    trained: int
    available_bytes: int
    asked: bool = False

    @property
    def reason(self) -> str:
        """The choice in words, e.g. "32 768 of 131 072 tokens: what fits in 20.00 GiB free"."""
        tokens, free = _count(self.tokens), gib_text(self.available_bytes)
        if self.asked:
            return f"{tokens} of {_count(self.trained)} tokens, as asked"
        if self.tokens >= self.trained:
            return f"{tokens} tokens: the model's full context, which fits in {free} free"
        if self.tokens >= DEFAULT_CONTEXT_CAP:
            return f"{tokens} of {_count(self.trained)} tokens: the default for chat, which fits in {free} free"
        return f"{tokens} of {_count(self.trained)} tokens: what fits in {free} free"


def choose_load(source: ModelSource, device: str, precision: str, context: int | None,
                available_bytes: int, kv_cache: str = "auto") -> tuple[str, ContextChoice]:
    """The precision (``precision``, or ``auto``'s pick) and the context of a load of ``source`` on ``device``,
    its KV cache in ``kv_cache`` (int8's half of bf16's bytes fits about twice the context).

    ``context`` None: the longest that fits comfortably up to ``DEFAULT_CONTEXT_CAP`` (``auto`` picks its precision
    for that length, else for ``MIN_CONTEXT``). A named ``context`` must be at most the trained length and fit.
    Raises ``ModelFileError`` for a context past the trained length, ``NotEnoughMemoryError`` (with the figures)
    when the weights leave no room for the context asked, or for ``MIN_CONTEXT`` tokens.
    """
    trained = source.native_context
    if context is not None:
        _check_asked(source, context, trained)
        chosen = _precision(source, device, precision, context, context, available_bytes, kv_cache)
        return chosen, ContextChoice(context, trained, available_bytes, asked=True)
    target, smallest = min(DEFAULT_CONTEXT_CAP, trained), min(MIN_CONTEXT, trained)
    chosen = _precision(source, device, precision, target, smallest, available_bytes, kv_cache)
    formats = formats_for_source(source, device, chosen, kv_cache=kv_cache)
    return chosen, ContextChoice(fitting_context(source, formats, available_bytes, target, smallest), trained,
                                 available_bytes)


def fitting_context(source: ModelSource, formats: FormatPlan, available_bytes: int, longest: int,
                    shortest: int) -> int:
    """The longest context up to ``longest`` whose estimate in ``formats`` fits comfortably in ``available_bytes``
    (below ``longest``, a whole number of ``CONTEXT_STEP``), and never below ``shortest``."""
    tokens = longest
    while tokens > shortest and not _fits(source, formats, tokens, available_bytes):
        tokens = (tokens - 1) // CONTEXT_STEP * CONTEXT_STEP
    return max(tokens, shortest)


def _fits(source: ModelSource, formats: FormatPlan, tokens: int, available_bytes: int) -> bool:
    return fit_verdict(estimate_formats(source, formats, tokens).total_bytes, available_bytes) == "fits"


def kv_budget_bytes(source: ModelSource, formats: FormatPlan, context: int) -> int:
    """What the KV block pool may take for ``context`` tokens: the KV cache the estimate counts."""
    return estimate_formats(source, formats, context).kv_bytes


def _precision(source: ModelSource, device: str, precision: str, target: int, smallest: int,
               available_bytes: int, kv_cache: str) -> str:
    """``precision``, or ``auto``'s pick for ``target`` tokens (else for ``smallest``); refused, with the figures,
    when even ``smallest`` tokens do not fit beside its weights."""
    if precision == "auto":
        try:
            return choose_precision(source, device, target, available_bytes, kv_cache)
        except NotEnoughMemoryError:
            if smallest == target:
                raise
            return choose_precision(source, device, smallest, available_bytes, kv_cache)
    needed = estimate(source, precision, smallest, device, kv_cache)
    if fit_verdict(needed.total_bytes, available_bytes) == "won't fit":
        raise not_enough_memory(source, precision, needed, smallest, device, available_bytes)
    return precision


def _check_asked(source: ModelSource, context: int, trained: int) -> None:
    if not 1 <= context <= trained:
        raise ModelFileError(
            f"{source.name} was trained for {_count(trained)} tokens of context; a context of {_count(context)} "
            f"cannot be used. Pick one from 1 to {_count(trained)}."
        )


def _count(tokens: int) -> str:
    return f"{tokens:,}".replace(",", " ")
