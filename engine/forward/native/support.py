"""Whether Hearth's CPU kernels may run here, without building them (any thread; imports no torch).

The CPU's flags; ``build.library()`` then also needs a C compiler and a build that
succeeds. ``format_plan`` counts formats by this before a load. Tests that need the
kernels off replace ``may_run`` (``docs/development.md``).
"""

from __future__ import annotations

from engine.host.cpu_features import has_flags

CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi")


def may_run() -> bool:
    return has_flags(CPU_FLAGS)
