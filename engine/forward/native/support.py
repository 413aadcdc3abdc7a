"""Which variants of Hearth's CPU kernels may run here, without building them (any thread; torch is imported when
first asked).

The best variant (``variants``, best first) whose instructions the CPU offers (``cpu_features``: cpuid's flags on
x86-64, within the vector width PyTorch runs at, so ``ATEN_CPU_CAPABILITY=avx2`` chooses "avx2vnni" or "avx2" as on a
laptop; "neon" on 64-bit ARM, Linux's and macOS's alike, where sdot is the library's own choice), or the one the
environment variable ``HEARTH_KERNELS`` names: "avx512", "avx2vnni", "avx2", "neon" (each only where the CPU runs it),
or "none", which turns the kernels off (tests and benchmarks compare the variants so). ``build.library()`` then also
needs the package's library or a C compiler. ``format_plan`` counts formats by this before a load.
"""

from __future__ import annotations

import os

from engine.forward.native.variants import NAMES, PROMPT_VARIANTS, VARIANTS, Variant, named
from engine.host.cpu_features import has_flags

CHOICE_VARIABLE = "HEARTH_KERNELS"


def candidates() -> tuple[tuple[Variant, ...], str]:
    """The variants that may run here, best first (``build`` loads the first whose library it has or can build), or
    none and the reason (in words, for the load's notice)."""
    asked = os.environ.get(CHOICE_VARIABLE, "")
    if asked == "none":
        return (), f"{CHOICE_VARIABLE}=none turns them off"
    if asked and asked not in NAMES:
        return (), f"{CHOICE_VARIABLE}={asked} names none of {', '.join(NAMES)}"
    runnable = tuple(variant for variant in ((named(asked),) if asked else VARIANTS) if has_flags(variant.cpu_flags))
    if runnable:
        return runnable, ""
    if asked:
        return (), f"this CPU lacks the {asked} variant's instructions"
    return (), "this CPU lacks AVX2 with FMA (x86-64) or NEON (64-bit ARM)"


def may_run() -> bool:
    return bool(candidates()[0])


def has_prompt_kernel() -> bool:
    """Whether the best variant that may run here multiplies prompt chunks of 4-bit layers itself
    (``PROMPT_VARIANTS``)."""
    runnable = candidates()[0]
    return bool(runnable) and runnable[0].name in PROMPT_VARIANTS


def has_amx_kernels() -> bool:
    """Whether the best variant that may run here holds the AMX functions (the CPU and Linux may still refuse the
    tiles; ``int4_matmul.runs_on_amx`` asks the loaded library)."""
    runnable = candidates()[0]
    return bool(runnable) and runnable[0].amx
