"""Whether Hearth's CPU kernels may run here, without building them (any thread; torch is imported when first asked).

The CPU's flags (``cpu_features``: cpuid's, within the vector width PyTorch runs at, so
``ATEN_CPU_CAPABILITY=avx2`` turns them off); ``build.library()`` then also needs a C compiler
and a build that succeeds. ``format_plan`` counts formats by this before a load. Tests that need the
kernels off replace ``may_run`` (``docs/development.md``).
"""

from __future__ import annotations

from engine.host.cpu_features import has_flags

CPU_FLAGS = ("avx512_f", "avx512_bw", "avx512_vl", "avx512_vnni", "avx512_vbmi")


def may_run() -> bool:
    return has_flags(CPU_FLAGS)
