"""Which variant of Hearth's CPU kernels runs here, without building it (any thread; torch is imported when first asked).

The best variant (``variants``, best first) whose instructions the CPU offers (``cpu_features``: cpuid's flags, within
the vector width PyTorch runs at, so ``ATEN_CPU_CAPABILITY=avx2`` chooses "avx2" as on a laptop), or the one the
environment variable ``HEARTH_KERNELS`` names: "avx512", "avx2" (each only where the CPU runs it), or "none", which
turns the kernels off (tests and benchmarks compare the variants so). ``build.library()`` then also needs the
package's library or a C compiler. ``format_plan`` counts formats by this before a load.
"""

from __future__ import annotations

import os

from engine.forward.native.variants import NAMES, VARIANTS, Variant, named
from engine.host.cpu_features import has_flags

CHOICE_VARIABLE = "HEARTH_KERNELS"


def chosen() -> tuple[Variant | None, str]:
    """The variant that runs here, or None and the reason none does (in words, for the load's notice)."""
    asked = os.environ.get(CHOICE_VARIABLE, "")
    if asked == "none":
        return None, f"{CHOICE_VARIABLE}=none turns them off"
    if asked and asked not in NAMES:
        return None, f"{CHOICE_VARIABLE}={asked} names none of {', '.join(NAMES)}"
    for variant in (named(asked),) if asked else VARIANTS:
        if has_flags(variant.cpu_flags):
            return variant, ""
    return None, f"this CPU lacks the {asked} variant's instructions" if asked else "this CPU lacks AVX2 with FMA"


def may_run() -> bool:
    return chosen()[0] is not None


def has_amx_kernels() -> bool:
    """Whether the variant that runs here holds the AMX functions (the CPU and Linux may still refuse the tiles)."""
    variant = chosen()[0]
    return variant is not None and variant.amx
