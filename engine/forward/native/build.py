"""Compiling ``kernels.c`` once per machine and loading it (engine thread; ``kernels`` is cached after the first call).

The library goes to ``<cache>/kernels/`` under a name made from the source, the flags,
the compiler's path and its version, so an edited kernel or a new compiler builds afresh
and an unchanged one loads in a millisecond. A build that fails leaves the compiler's
message beside it under the same name (``.failed``): later starts read it and do not try
again until the source or the compiler changes. It is built with ``-fopenmp`` and loaded
after PyTorch, whose ``libgomp.so.1`` it then shares: one pool of threads for both, sized by
``torch.set_num_threads``. Nothing here is required: no compiler, a CPU without the
instructions or a failed build leave ``library()`` None, and ``kernels().off_reason`` says why.

``gguf_layout.c`` (a GGUF file's blocks into the weight formats at load) is built the same way into a library of
its own, in portable C that any x86-64 CPU runs: ``layout_library()``, None only without a compiler or where the
build fails.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # first: the library's libgomp.so.1 is PyTorch's

from engine.forward.native.scratch import Scratch
from engine.forward.native.support import may_run
from engine.host.cpu_features import has_flags
from engine.host.paths import cache_dir

SOURCE = Path(__file__).with_name("kernels.c")
COMPILE_FLAGS = ("-O3", "-Wall", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512vbmi", "-mfma",
                 "-fopenmp", "-shared", "-fPIC")
LAYOUT_SOURCE = Path(__file__).with_name("gguf_layout.c")
LAYOUT_FLAGS = ("-O3", "-Wall", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")  # floats rounded as NumPy's
LAYOUT_AVX2 = ("avx2", "f16c")  # where the CPU has them, the layout library uses them (a quarter faster)
COMPILE_TIMEOUT_S = 120

P, I32, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
LANES = 16  # fp32 values a vector: the kernels take a head's or a row's dimensions whole vectors
SIGNATURES = {
    "int4_matmul": (P, I32, I32, P, P, I32, I32, I32, P, P),
    "int8_matmul": (P, I32, I32, P, P, I32, P, P),
    "decode_attention": (P, P, P, P, I32, P, P, I32, I32, I32, I64),
    "chunk_attention": (P, P, P, I32, I32, I32, P, I32, I32, I32, I32, I64, I32),
    "rms_norm": (P, I32, I32, ctypes.c_float, P),
    "swiglu": (P, I32, I32, P),
    "rotate_and_store": (P, P, I32, I32, I32, I32, P, I64, P),
    "int4_layout_from_nibbles": (P, I32, I32, I32, I64, I64, P),
    "int4_matmul_amx": (P, I32, I32, P, P, P, I32, I32, I32, P, P),
    "chunk_attention_amx": (P, P, P, I32, I32, I32, P, I32, I32, I32, I32, I64, I32),
}

LAYOUT_SIGNATURES = {
    "gguf_dense_rows": (P, I64, I64, I32, I32, P),
    "gguf_int4_groups": (P, I64, I64, I32, I32, I32, P, P, I64),
    "gguf_int4_pair": (P, I64, I64, I32, I32, P, P, P, P),
    "int8_layout_from_rows": (P, I64, I32, P, P),
}

log = logging.getLogger("hearth.kernels")
_ACTIVATION_CODES = Scratch(torch.uint8)


@dataclass(frozen=True)
class NativeKernels:
    """The loaded kernels, or None with the reason they are off (in words, for the load's notice)."""

    library: ctypes.CDLL | None
    off_reason: str = ""


@functools.cache
def kernels() -> NativeKernels:
    """This process's kernels, built or read from the cache on the first call (the module docstring)."""
    if not may_run():
        return NativeKernels(None, "this CPU lacks AVX-512 with VNNI and VBMI")
    compiler = _compiler()
    if compiler is None:
        return _off("no C compiler was found")
    try:
        loaded = _loaded(compiler, SOURCE, COMPILE_FLAGS)
    except (OSError, subprocess.SubprocessError) as error:
        return _off(f"they could not be built: {error}")
    _declare(loaded, SIGNATURES)
    loaded.amx_enable.argtypes, loaded.amx_enable.restype = (), I32
    return NativeKernels(loaded)


@functools.cache
def layout_library() -> ctypes.CDLL | None:
    """The load-time layout functions (``gguf_layout.c``), built or read from the cache on the first call; None
    without a C compiler or where they could not be built (the loaders' PyTorch ops run instead)."""
    compiler = _compiler()
    if compiler is None:
        return None
    try:
        wider = ("-mavx2", "-mf16c") if has_flags(LAYOUT_AVX2) else ()
        loaded = _loaded(compiler, LAYOUT_SOURCE, LAYOUT_FLAGS + wider)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("Hearth's load-time layout functions could not be built (%s); PyTorch's ops run instead.", error)
        return None
    _declare(loaded, LAYOUT_SIGNATURES)
    return loaded


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _declare(loaded: ctypes.CDLL, signatures: dict[str, tuple]) -> None:
    for name, arguments in signatures.items():
        function = getattr(loaded, name)
        function.argtypes, function.restype = arguments, None


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot run here (``kernels``)."""
    return kernels().library


def kernels_variant(device: str) -> str:
    """Which of Hearth's CPU kernels a model on ``device`` runs, as benchmarks record it: "avx512", or "none"."""
    return "avx512" if device == "cpu" and library() is not None else "none"


def off_notices() -> tuple[str, ...]:
    """The load's notice where the kernels are off (``LoadedModel.notices``), else none."""
    reason = kernels().off_reason
    return (f"Hearth's CPU kernels are off, so replies are slower: {reason}.",) if reason else ()


def _off(reason: str) -> NativeKernels:
    log.warning("Hearth's CPU kernels are off (%s); PyTorch's run instead.", reason)
    return NativeKernels(None, reason)


def _loaded(compiler: str, source: Path, flags: tuple[str, ...]) -> ctypes.CDLL:
    """The library, built first where needed; a cached copy that does not load (cut short, say) is built again."""
    target = _built(compiler, source, flags)
    try:
        return ctypes.CDLL(str(target))
    except OSError:
        target.unlink(missing_ok=True)
        return ctypes.CDLL(str(_built(compiler, source, flags)))


def _built(compiler: str, source: Path, flags: tuple[str, ...]) -> Path:
    """The library for this source, flags and compiler, compiled first where the cache lacks it; raises OSError with
    the compiler's message where this build failed before (``.failed``) or fails now (and records it)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([source.read_text(), *flags, compiler, version]).encode()).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    target = folder / f"hearth-{source.stem}-{key}.so"
    failure = target.with_suffix(".failed")
    if target.exists():
        return target
    if failure.exists():
        raise OSError(f"{_last_line(failure.read_text())} (recorded in {failure}; not retried until the source or "
                      "the compiler changes)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run([compiler, *flags, str(source), "-o", str(built), "-lm"],
                                capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if result.returncode != 0:
            message = result.stderr or f"{compiler} exited with {result.returncode}"
            failure.write_text(message)
            raise OSError(_last_line(message))
        os.replace(built, target)  # whole or not at all, should two processes build at once
    return target


def _last_line(message: str) -> str:
    """The compiler's last words, which name what stopped it."""
    lines = message.strip().splitlines()
    return lines[-1] if lines else "the compiler failed"


def address(tensor: torch.Tensor) -> int:
    """A contiguous CPU tensor's data, for a kernel's pointer argument."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("Hearth's CPU kernels take contiguous CPU tensors.")
    return tensor.data_ptr()


def activation_scratch(rows: int, width: int, group: int) -> int:
    """Where a matmul kernel quantizes ``rows`` activation rows of ``width`` (``quantize_activations``): up to two
    int8 codes a value, then a scale and the codes' sum (fp32) a group of ``group``; one reused buffer, by address."""
    return _ACTIVATION_CODES.address(rows * (2 * width + 8 * (width // group)))
