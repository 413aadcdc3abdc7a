"""How finely the CPU's int4 kernel rounds its activations (engine thread: the forward pass sets it per step).

Each group of 32 activations becomes int8 codes under one scale. A sequence's own rows
(a decode step, a prompt chunk) take two codes a value, about 15 bits: the built-in
model's teacher-forced next tokens nearly always agree with fp32's on the exact weights,
and it answers "What is the capital of France?" with Paris as fp32 does. A batched step of
several sequences takes one, as llama.cpp does (its Q8_0): its tokens drift about as far
from fp32's as llama.cpp's, and that question then gets llama.cpp's own answer, "L'Étoile,
la Marseillaise…". One row's call costs the same either way, since the memory's speed
sets it, but several rows' dot products set theirs, and one code takes fewer of them:
that is what makes a batched step faster. The int8 output layer keeps two codes in
every step (``int8_matmul``).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_CODES = contextvars.ContextVar("activation_codes", default=2)


def codes() -> int:
    """The int8 codes each activation takes in the kernel calls made now (``for_step``): 2 outside a step."""
    return _CODES.get()


@contextlib.contextmanager
def for_step(sequences: int) -> Iterator[None]:
    """Within it, the kernels round as a step over ``sequences`` sequences does: one code each where there are
    several, two for one."""
    token = _CODES.set(1 if sequences > 1 else 2)
    try:
        yield
    finally:
        _CODES.reset(token)
