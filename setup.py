"""Package list and the CPU kernels' libraries for setuptools; everything else about the build is in pyproject.toml.

The icons live in the top-level ``resources/`` folder and install as the
``hearth_resources`` package, a mapping pyproject.toml's package finder cannot express.

Every variant of the CPU kernels (``engine/forward/native/variants.py``) for the machine's architecture (x86-64's
"avx512" and "avx2", 64-bit ARM's "neon"; the others' sources ship unbuilt) is compiled here, with the variant's own
flags, into a plain shared library (no Python module: ctypes loads it) beside its source, so a wheel, an install and
an editable install carry them and run them without a C compiler. A variant the compiler cannot build (MSVC, which
takes no GCC attributes; a compiler without its instructions or without OpenMP, such as Apple's clang) is left out
with a warning, never failing the install: Hearth then runs without it, or builds it at run time where it can.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

NATIVE = "engine/forward/native"


def _variants():
    """``variants.py`` by its path: the engine package's imports need PyTorch, which a build need not have."""
    path = Path(__file__).parent / NATIVE / "variants.py"
    spec = importlib.util.spec_from_file_location("hearth_kernel_variants", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


KERNELS = _variants()
VARIANTS = {variant.name: variant for variant in KERNELS.VARIANTS if variant.architecture == KERNELS.architecture()}


class BuildKernels(build_ext):
    """Compiles each variant with its flags into ``variants.Variant.library_name``; one that fails is skipped."""

    def get_ext_filename(self, fullname: str) -> str:
        *package, name = fullname.split(".")
        if name not in VARIANTS:
            return super().get_ext_filename(fullname)
        return str(Path(*package, VARIANTS[name].library_name()))

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return list(ext.export_symbols)  # the kernels, not a Python module's PyInit_

    def build_extension(self, ext: Extension) -> None:
        variant = VARIANTS[ext.name.split(".")[-1]]
        msvc = self.compiler.compiler_type == "msvc"
        ext.extra_compile_args = list(variant.msvc_flags if msvc else variant.flags)
        ext.extra_link_args = [] if msvc else ["-fopenmp"]
        super().build_extension(ext)


def _kernel_library(name: str) -> Extension:
    variant = VARIANTS[name]
    return Extension(f"engine.forward.native.{name}", sources=[f"{NATIVE}/{variant.source}"],
                     depends=[f"{NATIVE}/{KERNELS.COMMON_HEADER}"], export_symbols=list(variant.exported()),
                     libraries=[] if sys.platform == "win32" else ["m"], optional=True)


setup(
    packages=[*find_packages(include=["app", "app.*", "engine", "engine.*"]), "hearth_resources"],
    package_dir={"hearth_resources": "resources"},
    ext_modules=[_kernel_library(name) for name in VARIANTS],
    cmdclass={"build_ext": BuildKernels},
)
