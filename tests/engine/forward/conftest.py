"""Fixtures of the forward pass's tests: Hearth's CPU kernels forced to each variant this CPU runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.forward.native import build
from engine.forward.native.support import CHOICE_VARIABLE
from engine.forward.native.variants import VARIANTS
from engine.host.cpu_features import has_flags

RUNNABLE = tuple(variant.name for variant in VARIANTS if has_flags(variant.cpu_flags)) or ("none",)


@pytest.fixture(params=RUNNABLE)
def kernel_variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each variant of Hearth's CPU kernels this CPU runs, loaded in turn (``HEARTH_KERNELS``); a test skips where
    none loads (no variant for this CPU, no library and no compiler)."""
    monkeypatch.setenv(CHOICE_VARIABLE, request.param)
    build.kernels.cache_clear()
    if build.library() is None:
        pytest.skip(f"Hearth's CPU kernels are off here: {build.kernels().off_reason}")
    yield request.param
    build.kernels.cache_clear()  # loaded again as the environment has it, once the variable is restored
