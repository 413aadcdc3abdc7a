"""How finely the CPU's int4, int8 and MXFP4 kernels round their activations (engine thread: the forward pass sets it per
step).

Each group of 32 activations becomes int8 codes under one scale. A sequence's own rows
(a decode step, a prompt chunk) take two codes a value, about 15 bits: the built-in
model's teacher-forced next tokens nearly always agree with fp32's on the exact weights,
and it answers "What is the capital of France?" with Paris as fp32 does. A batched step of
several sequences takes one, as llama.cpp does (its Q8_0): its tokens drift about as far
from fp32's as llama.cpp's, and that question then gets llama.cpp's own answer, "L'Étoile,
la Marseillaise…". One row's call costs the same either way, since the memory's speed
sets it, but several rows' dot products set theirs, and one code takes fewer of them:
that is what makes a batched step faster. The output layer keeps two codes in every
step (``for_output_layer``): there they take about a third of the built-in model's KL
against fp32 away in a batched step, for under 2 % of its time. A call of ``MANY_ROWS`` rows or
more (a prompt chunk) takes one code whatever the step (``codes_for_rows``): there the dot products set the
time, and one code costs half as many.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_CODES = contextvars.ContextVar("activation_codes", default=2)
MANY_ROWS = 128
"""Rows from which an int4 or int8 kernel call rounds its activations to one code a value whatever the step (a
prompt chunk): its sums then cost half as many dot products."""


def codes() -> int:
    """The int8 codes each activation takes in the kernel calls made now (``for_step``): 2 outside a step."""
    return _CODES.get()


def codes_for_rows(rows: int) -> int:
    """The codes a call of the int4 or int8 kernel over ``rows`` activation rows takes: one from ``MANY_ROWS`` on,
    else the step's (``codes``)."""
    return 1 if rows >= MANY_ROWS else codes()


def for_step(sequences: int) -> contextlib.AbstractContextManager[None]:
    """Within it, the kernels round as a step over ``sequences`` sequences does: one code each where there are
    several, two for one."""
    return _rounding(1 if sequences > 1 else 2)


def for_output_layer() -> contextlib.AbstractContextManager[None]:
    """Within it, the kernels round as the output layer does in every step: two codes a value."""
    return _rounding(2)


@contextlib.contextmanager
def _rounding(codes_a_value: int) -> Iterator[None]:
    token = _CODES.set(codes_a_value)
    try:
        yield
    finally:
        _CODES.reset(token)
