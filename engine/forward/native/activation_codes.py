"""How finely the CPU's int4 kernel rounds its activations (engine thread: the forward pass sets it per step).

Each group of 32 activations becomes int8 codes under one scale. A sequence's own rows
(a decode step, a prompt chunk) take two codes a value, about 15 bits: the built-in
model's teacher-forced next tokens agree with fp32 on the exact weights at 98.4 %
(mean KL 0.0001), and it answers "What is the capital of France?" with Paris as fp32
does. A batched step of several sequences takes one, as llama.cpp does (its Q8_0):
95.5 % (KL 0.0025; llama.cpp 94.3 %, 0.0035), and that question then gets llama.cpp's
own answer, "L'Étoile, la Marseillaise…". One row's call costs the same either way,
since the memory's speed sets it, but 8 rows' dot products set theirs: one code takes
0.68x the time of two on SmolLM2-1.7B's gate and up matrices, and its Q4_K_M decodes 8
requests at 52 tok/s against 41. The int8 output layer keeps two codes in every step
(``int8_matmul``).
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
