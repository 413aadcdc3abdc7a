"""Loading the variant of Hearth's CPU kernels that runs here (engine thread; ``kernels`` is cached after its first
call).

``support`` chooses the variant (``variants``). Its library is the one the package build left beside the sources
(``setup.py``: a wheel, an install or an editable install carry them), found by a name made from the sources and
flags, so a library built from other sources is never loaded. Where there is none (a source checkout run in place,
or a build whose compiler could not make it), the library is compiled here once per machine into ``<cache>/kernels/``
under a name that also holds the compiler's path and version, so an edited kernel or a new compiler builds afresh
and an unchanged one loads in a millisecond. A build that fails leaves the compiler's message beside it under the
same name (``.failed``): later starts read it and do not try again until the source or the compiler changes. It is
built with ``-fopenmp`` and loaded after PyTorch, whose ``libgomp.so.1`` it then shares: one pool of threads for
both, sized by ``torch.set_num_threads``. Nothing here is required: no variant for this CPU, no library and no
compiler, or a failed build leave ``library()`` None, and ``kernels().off_reason`` says why.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # first: the library's libgomp.so.1 is PyTorch's

from engine.forward.native import support
from engine.forward.native.scratch import Scratch
from engine.forward.native.variants import LAYOUT_AVX2, Variant, layout_variant
from engine.host.cpu_features import has_flags
from engine.host.paths import cache_dir

COMPILE_TIMEOUT_S = 120

P, I32, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
LANES = 16  # fp32 values a vector: the kernels take a head's or a row's dimensions whole vectors
SIGNATURES = {
    "int4_matmul": (P, I32, I32, P, P, I32, I32, I32, P, P),
    "int8_matmul": (P, I32, I32, P, P, I32, I32, P, P),
    "decode_attention": (P, P, P, P, I32, P, P, I32, I32, I32, I64, P),
    "chunk_attention": (P, P, P, I32, I32, I32, P, I32, I32, I32, I32, I64, I32),
    "rms_norm": (P, I32, I32, ctypes.c_float, P),
    "swiglu": (P, I32, I32, ctypes.c_float, ctypes.c_float, ctypes.c_float, P),
    "rotate_and_store": (P, P, I32, I32, I32, I32, P, I64, P),
    "int4_layout_from_nibbles": (P, I32, I32, I32, I64, I64, P),
    "int4_matmul_amx": (P, I32, I32, P, P, P, I32, I32, I32, P, P),
    "chunk_attention_amx": (P, P, P, I32, I32, I32, P, I32, I32, I32, I32, I64, I32),
    "mxfp4_matmul": (P, I32, I32, P, I32, P, I32, P, P),
    "mxfp4_experts": (P, I32, I32, P, I32, I32, I32, P, P),
    "mxfp4_strips_from_rows": (P, I32, I32, P),
    "mxfp4_matmul_amx": (P, I32, I32, P, P, I32, I32, P, P),
    "decode_attention_q8": (P, P, P, P, I32, P, P, I32, I32, I32, I64, P),
    "chunk_attention_q8": (P, P, P, I32, I32, I32, P, I32, I32, I32, I32, I64, I32),
    "rotate_and_store_q8": (P, P, I32, I32, I32, I32, P, I64, P),
}

LAYOUT_SIGNATURES = {
    "gguf_dense_rows": (P, I64, I64, I32, I32, P),
    "gguf_int4_groups": (P, I64, I64, I32, I32, I32, P, P, I64),
    "gguf_int4_pair": (P, I64, I64, I32, I32, P, P, P, P),
    "int8_layout_from_rows": (P, I64, I32, P, P),
    "int8_layout_from_codes": (P, P, I64, I32, P, P),
}

log = logging.getLogger("hearth.kernels")
_ACTIVATION_CODES = Scratch(torch.uint8)


@dataclass(frozen=True)
class NativeKernels:
    """The loaded kernels and their variant's name, or None with the reason they are off (in words, for the load's
    notice); ``mxfp4_strips``: whether they take MXFP4 weights in strips (``Variant.mxfp4_strips``)."""

    library: ctypes.CDLL | None
    variant: str = "none"
    off_reason: str = ""
    mxfp4_strips: bool = False


@functools.cache
def kernels() -> NativeKernels:
    """This process's kernels, loaded, built or read from the cache on the first call (the module docstring)."""
    runnable, reason = support.candidates()
    if not runnable:
        return _off(reason)
    failures = []
    for variant in runnable:
        try:
            return _bound(_loaded(variant), variant)
        except (OSError, subprocess.SubprocessError) as error:
            failures.append(f"the {variant.name} variant could not be built: {error}")
    return _off("; ".join(failures))


def _bound(loaded: ctypes.CDLL, variant: Variant) -> NativeKernels:
    """``loaded`` with its functions' argument types set."""
    for name, arguments in SIGNATURES.items():
        if name in variant.exported():
            function = getattr(loaded, name)
            function.argtypes, function.restype = arguments, None
    loaded.amx_enable.argtypes, loaded.amx_enable.restype = (), I32
    return NativeKernels(loaded, variant.name, mxfp4_strips=variant.mxfp4_strips)


@functools.cache
def layout_library() -> ctypes.CDLL | None:
    """The load-time layout functions (``gguf_layout.c``), built or read from the cache on the first call; None
    without a C compiler or where they could not be built (the loaders' PyTorch ops run instead)."""
    variant = layout_variant(has_flags(LAYOUT_AVX2))
    try:
        loaded = _loaded(variant)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("Hearth's load-time layout functions could not be built (%s); PyTorch's ops run instead.", error)
        return None
    for name, arguments in LAYOUT_SIGNATURES.items():
        function = getattr(loaded, name)
        function.argtypes, function.restype = arguments, None
    return loaded


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot run here (``kernels``)."""
    return kernels().library


def kernels_variant(device: str) -> str:
    """Which of Hearth's CPU kernels a model on ``device`` runs, as benchmarks record it: "avx512", "avx2vnni",
    "avx2", "neon" or "none"."""
    return kernels().variant if device == "cpu" else "none"


def kernel_notices() -> tuple[str, ...]:
    """The load's notice of the kernels a CPU model runs (``LoadedModel.notices``): their variant, or why they are
    off."""
    loaded = kernels()
    if loaded.library is None:
        return (f"Hearth's CPU kernels are off, so replies are slower: {loaded.off_reason}.",)
    return (f"Hearth's CPU kernels run their {loaded.variant} variant.",)


def _off(reason: str) -> NativeKernels:
    log.warning("Hearth's CPU kernels are off (%s); PyTorch's run instead.", reason)
    return NativeKernels(None, off_reason=reason)


def _loaded(variant: Variant) -> ctypes.CDLL:
    """The package's library of ``variant``, else the cache's, built first where needed; a cached copy that does not
    load (cut short, say) is built again."""
    packaged = variant.packaged_library()
    if packaged.exists():
        return ctypes.CDLL(str(packaged))
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise OSError("the package holds no library for this CPU and no C compiler was found")
    target = _built(variant, compiler)
    try:
        return ctypes.CDLL(str(target))
    except OSError:
        target.unlink(missing_ok=True)
        return ctypes.CDLL(str(_built(variant, compiler)))


def _built(variant: Variant, compiler: str) -> Path:
    """The library of ``variant`` for this compiler, compiled first where the cache lacks it; raises OSError with
    the compiler's message where this build failed before (``.failed``) or fails now (and records it)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    folder = cache_dir() / "kernels"
    target = folder / variant.library_name(compiler, version)
    failure = target.with_suffix(".failed")
    if target.exists():
        return target
    if failure.exists():
        raise OSError(f"{_last_line(failure.read_text())} (recorded in {failure}; not retried until the source or "
                      "the compiler changes)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / target.name
        command = [compiler, *variant.flags, "-shared", str(variant.source_path()), "-o", str(built), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
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


def activation_scratch(rows: int, width: int, group: int, starts: bool = False) -> int:
    """Where a matmul kernel quantizes ``rows`` activation rows of ``width`` (``quantize_activations``): up to two
    int8 codes a value, then a scale and the codes' sum (fp32) a group of ``group``, and with ``starts`` 8 bytes more
    a group (``mxfp4_matmul``'s int32 start of each group's sum, for each of its two codes); one reused buffer, by
    address."""
    groups = width // group
    return _ACTIVATION_CODES.address(rows * (2 * width + 8 * groups + (8 * groups if starts else 0)))
