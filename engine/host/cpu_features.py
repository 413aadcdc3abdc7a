"""What the CPU's instruction set offers the weight formats (any thread; reads ``/proc/cpuinfo`` once).

``has_fp16_math``: AVX512-FP16 (Intel Sapphire Rapids and later), where oneDNN's fp16
matmul multiplies in half precision at twice fp32's rate. Elsewhere (other CPUs, or
systems without ``/proc/cpuinfo``) it is False, and fp16 weights stay on FBGEMM's kernel.
"""

from __future__ import annotations

import functools
import os

FP16_FLAG = "avx512_fp16"
FEATURES_ENV = "HEARTH_CPU_FP16"  # "0" turns the fp16 matmul off (to compare, or where it misbehaves)


@functools.cache
def has_fp16_math() -> bool:
    if os.environ.get(FEATURES_ENV, "1") == "0":
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return FP16_FLAG in flags.split()
