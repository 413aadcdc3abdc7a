"""Session-wide test setup: no display, no writes to the user's folders, GPU tests gated.

- ``QT_QPA_PLATFORM`` defaults to ``offscreen`` so Qt tests need no display.
- ``HEARTH_HOME`` defaults to a fresh temporary folder for the whole run, so no
  test reads or writes the user's chats or models. A run may set it itself.
- The ``default_model_path`` fixture gives tests the real built-in model that
  ``make test`` (``python -m engine.models.default_model``) fetched. It is looked up
  *before* ``HEARTH_HOME`` is overridden: first under the run's own
  ``HEARTH_HOME`` (when the run sets one), then in the user's cache folder.
  Tests that use it are skipped when neither holds the model.
- Tests marked ``gpu`` are skipped unless ``torch.cuda.is_available()``; torch is
  imported only when such a test was collected.
- Tests marked ``peer`` need llama.cpp, the benchmarks' yardstick, and are skipped
  unless ``engine.bench.peer`` finds its interpreter (``<repo>/.peer`` or
  ``$HEARTH_PEER_PYTHON``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from engine.models import default_model

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _present_model_under(hearth_home: str | None) -> Path | None:
    """The built-in model's path under ``hearth_home`` (None: HEARTH_HOME unset), if fetched."""
    saved = os.environ.pop("HEARTH_HOME", None)
    if hearth_home is not None:
        os.environ["HEARTH_HOME"] = hearth_home
    try:
        present = default_model.is_default_model_present()
        return default_model.default_model_path() if present else None
    finally:
        os.environ.pop("HEARTH_HOME", None)
        if saved is not None:
            os.environ["HEARTH_HOME"] = saved


def _find_fetched_default_model() -> Path | None:
    run_home = os.environ.get("HEARTH_HOME")
    homes = [run_home, None] if run_home else [None]
    return next(filter(None, (_present_model_under(home) for home in homes)), None)


_FETCHED_DEFAULT_MODEL = _find_fetched_default_model()
_SESSION_HOME: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_HOME
    if not os.environ.get("HEARTH_HOME"):
        _SESSION_HOME = tempfile.mkdtemp(prefix="hearth-tests-")
        os.environ["HEARTH_HOME"] = _SESSION_HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_HOME is not None:
        os.environ.pop("HEARTH_HOME", None)
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_peer_tests_without_peer(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is false")
    for item in gpu_items:
        item.add_marker(skip)


def _skip_peer_tests_without_peer(items: list[pytest.Item]) -> None:
    peer_items = [item for item in items if item.get_closest_marker("peer")]
    if not peer_items:
        return
    from engine.bench.peer import SETUP, peer_python

    if peer_python() is not None:
        return
    skip = pytest.mark.skip(reason=f"needs llama.cpp: run `{SETUP}`, or set HEARTH_PEER_PYTHON")
    for item in peer_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The real built-in GGUF model fetched before the run; skips the test without it."""
    if _FETCHED_DEFAULT_MODEL is None:
        pytest.skip("built-in model not fetched: run `python -m engine.models.default_model` first")
    return _FETCHED_DEFAULT_MODEL
