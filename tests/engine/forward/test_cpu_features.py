"""Which CPU kernels the weight formats use follows the CPU's flags (``cpu_features``), and can be turned off."""

from __future__ import annotations

import pytest

from engine.host import cpu_features


@pytest.mark.parametrize("flags, int8_dot", [
    ({"avx2", "fma"}, False), ({"avx2", "avx_vnni"}, True), ({"avx512f", "avx512_vnni"}, True), ({"amx_int8"}, True),
])
def test_int8_gemms_need_vnni_and_fp16_math_needs_avx512_fp16(flags, int8_dot, monkeypatch):
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset(flags))
    assert cpu_features.has_int8_dot() is int8_dot
    assert cpu_features.has_fp16_math() is False


def test_bf16_gemms_need_amx_bf16_tiles(monkeypatch):
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_int8"}))
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
    monkeypatch.setattr(cpu_features, "_flags", lambda: frozenset({"avx512f"}))
    assert not cpu_features.has_amx_tiles()
