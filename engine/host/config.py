"""The settings a user may give Hearth's engine through the environment (any thread; imports no torch).

Two, both user-facing: ``HEARTH_HOME`` puts every file Hearth keeps under one folder (``paths``),
and ``HEARTH_THREADS`` sets how many CPU threads the model uses (``cpu_threads``, applied once
when the engine thread starts). Nothing on a forward pass reads the environment: formats
follow the CPU and the model (``engine.models.format_plan``); tests that need another CPU's
choices replace the feature functions (``docs/development.md``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "HEARTH_HOME"
THREADS_ENV = "HEARTH_THREADS"


@dataclass(frozen=True)
class EngineConfig:
    """``home``: the folder for every file Hearth keeps, or None for the platform's usual ones.
    ``threads``: the engine's CPU threads, or None for one per physical core."""

    home: Path | None = None
    threads: int | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> EngineConfig:
        """The settings ``environ`` gives; a ``HEARTH_THREADS`` that is not a positive whole number is ignored."""
        home, threads = environ.get(HOME_ENV), environ.get(THREADS_ENV, "")
        return cls(Path(home) if home else None, int(threads) if threads.isdigit() and int(threads) > 0 else None)
