"""Which CPU kernels the weight formats use follows the CPU's flags (``cpu_features``), within the vector width
PyTorch runs at, on any system: an AVX2-only CPU (emulated with ``ATEN_CPU_CAPABILITY=avx2``) runs no AVX-512 code."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.forward.native import build, support
from engine.forward.native.variants import VARIANTS, architecture, named
from engine.host import cpu_features

REPO = Path(__file__).resolve().parents[3]
CPU_FLAGS = named("avx512").cpu_flags


@pytest.mark.parametrize("flags, int8_dot", [
    ({"avx2", "fma"}, False), ({"avx2", "avx_vnni"}, True), ({"avx512_f", "avx512_vnni"}, True), ({"amx_int8"}, True),
])
def test_int8_gemms_need_vnni_and_fp16_math_needs_avx512_fp16(flags, int8_dot, monkeypatch):
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset(flags))
    assert cpu_features.has_int8_dot() is int8_dot
    assert cpu_features.has_fp16_math() is False


def test_bf16_gemms_need_amx_bf16_tiles(monkeypatch):
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"avx512_f", "avx512_bf16", "amx_int8"}))
    assert cpu_features.has_bf16_matmul() is False
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"amx_tile", "amx_bf16"}))
    assert cpu_features.has_bf16_matmul() is True


def test_the_features_follow_the_cpu_whatever_the_environment_says(monkeypatch):
    """Earlier versions read experiment switches here on every call; the CPU's flags alone decide now."""
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"avx512_vnni", "avx512_fp16", "amx_bf16"}))
    for name in ("HEARTH_CPU_INT8", "HEARTH_CPU_FP16", "HEARTH_CPU_BF16"):
        monkeypatch.setenv(name, "0")
    assert cpu_features.has_int8_dot() and cpu_features.has_fp16_math() and cpu_features.has_bf16_matmul()


def test_amx_tiles_need_the_flags_and_linux_s_grant(monkeypatch):
    """On a kernel that refuses the tile state (older than 5.16) the tiles count as absent, so ``auto`` chooses as
    on a CPU without them rather than running an instruction Linux would kill the process for."""
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"amx_tile", "amx_bf16"}))
    monkeypatch.setattr(cpu_features, "_tiles_granted", lambda: False)
    assert cpu_features.has_bf16_matmul() and not cpu_features.has_amx_tiles()
    monkeypatch.setattr(cpu_features, "_tiles_granted", lambda: True)
    assert cpu_features.has_amx_tiles()
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"avx512_f"}))
    assert not cpu_features.has_amx_tiles()


@pytest.fixture
def cpu(monkeypatch):
    """Stands in for PyTorch's view of the CPU: ``cpu(capability, flags)``; the flags are read afresh."""

    def answering(capability: str, flags: set[str]) -> None:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**dict.fromkeys(flags, True), "l1d_cache_size": 1})
        cpu_features._flags.cache_clear()

    yield answering
    cpu_features._flags.cache_clear()


def test_an_avx2_capability_hides_the_avx512_and_amx_flags_the_cpu_has(cpu):
    """A laptop's width: the flags beyond it do not count, those within it (AVX-VNNI's int8 dots) still do."""
    every = {"avx2", "fma3", "avx_vnni", *CPU_FLAGS, "avx512_fp16", "amx_bf16"}
    cpu("AVX512", every)
    assert cpu_features.has_flags(CPU_FLAGS) and cpu_features.has_fp16_math() and cpu_features.has_bf16_matmul()
    cpu("AVX2", every)
    assert not cpu_features.has_flags(("avx512_f",)) and not cpu_features.has_fp16_math()
    assert not cpu_features.has_bf16_matmul() and cpu_features.has_int8_dot() and cpu_features.has_flags(("avx2",))
    cpu("DEFAULT", every)
    assert not cpu_features.has_int8_dot() and not cpu_features.has_flags(("avx2",))


ARM_FLAGS = {"neon", "dot", "fp16_arith", "bf16", "i8mm", "atomics", "crc32"}  # PyTorch's names on an ARM64 CPU
X86_FLAGS = {"sse2", "avx", "avx2", "fma3", "f16c", "avx_vnni", *CPU_FLAGS, "amx_bf16"}


@pytest.mark.parametrize("capability", ["DEFAULT", "SVE256"])  # Apple's M chips and most ARM servers; Graviton 3
def test_an_arm_cpu_runs_the_neon_kernels_and_an_x86_one_never_does(cpu, monkeypatch, capability):
    """Where PyTorch sees an ARM CPU, "neon" is the variant that runs, and ``HEARTH_KERNELS`` may force it; on x86
    it never runs, not even when asked for."""
    monkeypatch.delenv(support.CHOICE_VARIABLE, raising=False)
    cpu(capability, ARM_FLAGS)
    assert [variant.name for variant in support.candidates()[0]] == ["neon"]
    monkeypatch.setenv(support.CHOICE_VARIABLE, "neon")
    assert [variant.name for variant in support.candidates()[0]] == ["neon"]
    monkeypatch.setenv(support.CHOICE_VARIABLE, "avx2")
    assert support.candidates() == ((), "this CPU lacks the avx2 variant's instructions")
    for x86_capability in ("AVX512", "AVX2", "DEFAULT"):
        cpu(x86_capability, X86_FLAGS)
        monkeypatch.delenv(support.CHOICE_VARIABLE)
        assert "neon" not in [variant.name for variant in support.candidates()[0]]
        monkeypatch.setenv(support.CHOICE_VARIABLE, "neon")
        assert support.candidates() == ((), "this CPU lacks the neon variant's instructions")


def test_on_an_arm_cpu_the_load_notice_and_benchmarks_name_the_neon_kernels(cpu, monkeypatch):
    """What a load says and a benchmark records where the ARM library loads (stood in for here: no ARM machine)."""
    monkeypatch.delenv(support.CHOICE_VARIABLE, raising=False)
    cpu("DEFAULT", ARM_FLAGS)
    loaded = []

    def library_of(variant):  # the functions' argument types are set on whatever it holds
        loaded.append(variant.name)
        return SimpleNamespace(**{name: SimpleNamespace() for name in variant.exported()})

    monkeypatch.setattr(build, "_loaded", library_of)
    build.kernels.cache_clear()
    try:
        assert build.kernels_variant("cpu") == "neon" and loaded == ["neon"]
        assert build.kernel_notices() == ("Hearth's CPU kernels run their neon variant.",)
    finally:
        build.kernels.cache_clear()


def test_the_variants_are_built_for_their_own_architecture():
    """``setup.py`` builds the variants of the machine's architecture, as ``platform.machine()`` names it."""
    built_on = {machine: [variant.name for variant in VARIANTS if variant.architecture == architecture(machine)]
                for machine in ("x86_64", "AMD64", "aarch64", "arm64", "riscv64")}
    assert built_on == {"x86_64": ["avx512", "avx2vnni", "avx2"], "AMD64": ["avx512", "avx2vnni", "avx2"],
                        "aarch64": ["neon"], "arm64": ["neon"], "riscv64": []}


def test_the_flags_need_no_proc_cpuinfo(monkeypatch):
    """Windows and macOS have no ``/proc``: the flags come from PyTorch's cpuid reading all the same."""
    opened = builtins.open

    def no_proc(file, *args, **kwargs):
        if str(file).startswith("/proc"):
            raise FileNotFoundError(file)
        return opened(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    cpu_features._flags.cache_clear()
    try:
        offered = {name for name, on in torch.cpu.get_capabilities().items() if on is True}
        wide = torch.backends.cpu.get_cpu_capability() == "AVX512"
        assert cpu_features.has_flags(CPU_FLAGS) is (wide and offered.issuperset(CPU_FLAGS))
        assert cpu_features.has_flags(("sse2",)) is ("sse2" in offered)
    finally:
        cpu_features._flags.cache_clear()


def test_an_avx2_only_cpu_runs_hearths_avx2_kernels():
    asks = ("from engine.forward.native import build, support; from engine.host import cpu_features; "
            "print(support.may_run(), cpu_features.has_flags(('avx512_f',)), build.library() is None, "
            "build.kernels_variant('cpu'), build.kernel_notices())")
    environment = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "PYTHONPATH": str(REPO)}
    environment.pop("HEARTH_KERNELS", None)
    result = subprocess.run([sys.executable, "-c", asks], capture_output=True, text=True, timeout=300, cwd=REPO,
                            env=environment, check=True)
    may_run, avx512, off, variant, notices = result.stdout.strip().split(" ", 4)
    expected = "avx2vnni" if torch.cpu.get_capabilities().get("avx_vnni") is True else "avx2"  # Intel's since Alder Lake
    assert (may_run, avx512, off, variant) == ("True", "False", "False", expected)
    assert f"{expected} variant" in notices


@pytest.mark.parametrize(("kernels", "notice", "formats"), [
    ("avx2", "avx2 variant", "int4 weights alone"), ("none", "kernels are off", "int4 copy for decoding"),
])
def test_on_an_avx2_only_cpu_the_built_in_model_still_answers(default_model_path: Path, kernels: str, notice: str,
                                                              formats: str):
    """On Hearth's AVX2 kernels the 4-bit weights alone run prompts and decode steps in Hearth's layout; without
    them an fp16 copy takes the prompts, and PyTorch's AVX2 build of its int4 kernel blocks the decode copy's rows
    otherwise than its AVX-512 one, so PyTorch lays the copy out (``cpu_int4_layout``): given the AVX-512 layout it
    answered noise."""
    ask = [sys.executable, "-m", "engine", "chat", "--model", str(default_model_path), "--device", "cpu",
           "--prompt", "What is the capital of France?", "--max-tokens", "12"]
    environment = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "PYTHONPATH": str(REPO), "HEARTH_KERNELS": kernels}
    result = subprocess.run(ask, capture_output=True, text=True, timeout=600, cwd=REPO, env=environment, check=True)
    assert formats in result.stderr and notice in result.stderr
    assert "Paris" in result.stdout
