"""What the CPU's instruction set offers the weight formats (any thread; asks PyTorch once, importing it then).

The flags are cpuid's, as PyTorch's cpuinfo reads them on Linux, macOS and Windows alike
(``torch.cpu.get_capabilities``, its names: ``avx512_f``, ``avx512_vnni``, ``amx_bf16``...), capped by
the vector width PyTorch's own kernels use (``torch.backends.cpu.get_cpu_capability``): with
``ATEN_CPU_CAPABILITY=avx2`` (how an AVX2-only laptop CPU is emulated) no AVX-512 or AMX flag counts, so
Hearth runs as on such a CPU. A PyTorch without ``get_capabilities`` (older than the pinned one) reports
no flags, and the weights stay on the kernels that need none.

``has_fp16_math``: AVX512-FP16 (Intel Sapphire Rapids and later), where oneDNN's fp16
matmul multiplies in half precision at twice fp32's rate. ``has_int8_dot``: VNNI's int8
dot products (AVX512-VNNI, AVX-VNNI or AMX), where oneDNN's int8 GEMM runs at about four
times fp32's rate; on AVX2 alone it is slower than fp32 and saturates its int16 sums (large
relative errors). ``has_amx_tiles``: the bf16 tiles and Linux's grant of their state to this
process (``arch_prctl``, Linux 5.16 and later): without it a tile instruction is an illegal one,
however the CPU's flags read. The answers are the hardware's: tests that need another CPU's
answers replace these functions (``docs/development.md``).
"""

from __future__ import annotations

import ctypes
import functools
import platform

FP16_FLAG = "avx512_fp16"
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
BF16_MATMUL_FLAG = "amx_bf16"
BEYOND_WIDTH = {"AVX2": ("avx512", "amx"), "DEFAULT": ("avx", "amx", "fma")}
"""The flags that do not count under each of PyTorch's capabilities (by prefix); "AVX512" keeps them all."""
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux's numbers


def cpu_name() -> str:
    """The CPU's model name as the OS gives it (Linux's ``/proc/cpuinfo``; elsewhere ``platform.processor``), for
    benchmark reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            named = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        named = ""
    return named or platform.processor() or platform.machine()


def has_fp16_math() -> bool:
    return FP16_FLAG in _flags()


def has_bf16_matmul() -> bool:
    return BF16_MATMUL_FLAG in _flags()


def has_amx_tiles() -> bool:
    """``has_bf16_matmul`` and the tile state granted to this process (asked once; the grant lasts its life)."""
    return has_bf16_matmul() and _tiles_granted()


def has_int8_dot() -> bool:
    return any(flag in _flags() for flag in INT8_DOT_FLAGS)


def has_flags(flags: tuple[str, ...]) -> bool:
    """Whether the CPU offers every one of ``flags`` (``torch.cpu.get_capabilities``' names)."""
    return all(flag in _flags() for flag in flags)


@functools.cache
def _tiles_granted() -> bool:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


@functools.cache
def _flags() -> frozenset[str]:
    import torch  # here, not above: the window imports this package and never torch

    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    beyond = BEYOND_WIDTH.get(torch.backends.cpu.get_cpu_capability(), ())
    return frozenset(name for name, offered in capabilities.items() if offered is True and not name.startswith(beyond))
