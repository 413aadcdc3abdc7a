"""Whether Hearth's CPU kernels may run here, without building them (any thread; imports no torch).

The CPU's flags and ``HEARTH_NATIVE``; ``build.library()`` then also needs a C compiler
and a build that succeeds. ``memory_estimate`` counts formats by this before a load.
"""

from __future__ import annotations

import os

from engine.host.cpu_features import has_flags

CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi")
ENV = "HEARTH_NATIVE"  # "0": PyTorch's ops only (to compare, or where a kernel misbehaves)


def may_run() -> bool:
    return os.environ.get(ENV, "1") != "0" and has_flags(CPU_FLAGS)
