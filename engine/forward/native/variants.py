"""The instruction-set variants of Hearth's CPU kernels: their sources, compiler flags and library names (any thread;
imports nothing of Hearth's, so that ``setup.py`` reads it by path while building the package).

Each variant is one library with the same exported functions: "avx512" (``kernels.c``: AVX-512 F, BW, VL, VNNI and
VBMI, with the AMX functions for their own target), "avx2" (``kernels_avx2.c``: AVX2, FMA and F16C, as on most
laptops) and "avx2vnni" (the same source with AVX-VNNI's int8 dot products, as on Intel's laptop CPUs since Alder
Lake) on x86-64; "neon" (``kernels_neon.c``: plain ARMv8-A, taking the dot-product extension's sdot where the CPU
has it, which the library asks itself) on 64-bit ARM. ``setup.py`` compiles every variant of the machine's
architecture its compiler can into the package; ``build`` loads the best one the CPU runs, or compiles it at run time
where the package holds none (a source checkout). A library's name carries a hash of
its sources and flags, so a library built from other sources is never loaded for these.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
COMMON_HEADER = "kernels_common.h"  # included by every variant's source


@dataclass(frozen=True)
class Variant:
    """One library: ``name`` as benchmarks record it, its C source beside this module, the flags GCC and clang take
    and those MSVC takes, the CPU flags it needs (``torch.cpu.get_capabilities``' names), whether it holds the
    AMX functions (``AMX_EXPORTED``), the architecture whose compilers build it (``architecture``'s names), whether
    it holds the int8 KV cache's functions (``INT8_KV_EXPORTED``) and whether its MXFP4 functions take the weights in
    strips of 8 rows rather than as the file's rows of blocks (``mxfp4.in_strips``, ``MXFP4_STRIPS_EXPORTED``)."""

    name: str
    source: str
    flags: tuple[str, ...]
    msvc_flags: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    amx: bool = False
    architecture: str = "x86_64"
    int8_kv: bool = True
    mxfp4_strips: bool = False

    def exported(self) -> tuple[str, ...]:
        return (*EXPORTED, *(AMX_EXPORTED if self.amx else ()), *(INT8_KV_EXPORTED if self.int8_kv else ()),
                *(MXFP4_STRIPS_EXPORTED if self.mxfp4_strips else ()))

    def source_path(self) -> Path:
        return HERE / self.source

    def packaged_library(self) -> Path:
        """Where ``setup.py`` leaves this variant's library, built from these sources."""
        return HERE / self.library_name()

    def key(self, *extra: str) -> str:
        """A hash of the sources, the flags and ``extra`` (the run-time build adds its compiler's path and version)."""
        texts = [path.read_text() for path in (self.source_path(), HERE / COMMON_HEADER)]
        return hashlib.sha256("\0".join([*texts, *self.flags, *extra]).encode()).hexdigest()[:16]

    def library_name(self, *extra: str) -> str:
        return f"hearth-kernels-{self.name}-{self.key(*extra)}{LIBRARY_SUFFIX}"


LIBRARY_SUFFIX = ".dll" if sys.platform == "win32" else ".so"
UNIX_FLAGS = ("-O3", "-Wall", "-fopenmp", "-fPIC")
VARIANTS = (  # best first
    Variant("avx512", "kernels.c",
            (*UNIX_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512vbmi", "-mfma", "-mf16c"),
            ("/O2", "/openmp", "/arch:AVX512"),
            ("avx512_f", "avx512_bw", "avx512_vl", "avx512_vnni", "avx512_vbmi"), amx=True, mxfp4_strips=True),
    Variant("avx2vnni", "kernels_avx2.c", (*UNIX_FLAGS, "-mavx2", "-mfma", "-mf16c", "-mavxvnni"),
            ("/O2", "/openmp", "/arch:AVX2", "/D__AVXVNNI__"), ("avx2", "fma3", "f16c", "avx_vnni"),
            mxfp4_strips=True),
    Variant("avx2", "kernels_avx2.c", (*UNIX_FLAGS, "-mavx2", "-mfma", "-mf16c"), ("/O2", "/openmp", "/arch:AVX2"),
            ("avx2", "fma3", "f16c"), mxfp4_strips=True),
    Variant("neon", "kernels_neon.c", UNIX_FLAGS, (), ("neon",), architecture="aarch64", int8_kv=False),
)
NAMES = (*(variant.name for variant in VARIANTS), "none")
PROMPT_VARIANTS = ("avx512", "avx2vnni", "avx2")
"""Variants whose int4 kernel also takes prompt chunks, where ``int4_prompts``' int8 GEMM is slower: on AVX2 alone,
on SmolLM2-1.7B's matrices a chunk of 128 rows took oneDNN's GEMM 261 ms of a thread, the avx2 kernel 154 and
avx2vnni's 118 (two codes a value); of 512 rows, 739, 618 and 485. Each weight stays exact, where the GEMM rounds it
to int8."""
EXPORTED = ("int4_matmul", "int8_matmul", "decode_attention", "chunk_attention", "rms_norm", "swiglu",
            "rotate_and_store", "int4_layout_from_nibbles", "amx_enable", "mxfp4_matmul",
            "mxfp4_experts")
"""What every variant's library exports (``amx_enable`` returns -1 where the variant has no AMX functions)."""
AMX_EXPORTED = ("int4_matmul_amx", "chunk_attention_amx", "mxfp4_matmul_amx")  # only where ``Variant.amx``
INT8_KV_EXPORTED = ("decode_attention_q8", "chunk_attention_q8", "rotate_and_store_q8")
"""The int8 KV cache's functions (``decode_attention.reads_int8``), only where ``Variant.int8_kv``: the neon variant
has none yet, and its int8 cache runs in PyTorch's ops."""
MXFP4_STRIPS_EXPORTED = ("mxfp4_strips_from_rows",)  # only where ``Variant.mxfp4_strips``


def named(name: str) -> Variant:
    return next(variant for variant in VARIANTS if variant.name == name)


ARCHITECTURES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}
"""``platform.machine()``'s names (Linux, macOS, Windows) of the architectures the variants are built for."""


def architecture(machine: str | None = None) -> str:
    """The architecture of ``machine`` (``platform.machine()``'s name; this machine's by default) as the variants
    name it: "x86_64", "aarch64", or the name itself, lowercase, where no variant is built for it."""
    name = (machine if machine is not None else platform.machine()).lower()
    return ARCHITECTURES.get(name, name)

LAYOUT_FLAGS = ("-O3", "-Wall", "-ffp-contract=off", "-fopenmp", "-fPIC")  # floats rounded as NumPy's
LAYOUT_AVX2 = ("avx2", "f16c")  # where the CPU has them, the layout library uses them (a quarter faster)


def layout_variant(avx2: bool) -> Variant:
    """The load-time layout library (``gguf_layout.c``: portable C, AVX2 and F16C where ``avx2``), compiled at run
    time for the CPU at hand, never packaged (its flags follow the CPU)."""
    flags = (*LAYOUT_FLAGS, "-mavx2", "-mf16c") if avx2 else LAYOUT_FLAGS
    return Variant("layout-avx2" if avx2 else "layout", "gguf_layout.c", flags, (), ())
