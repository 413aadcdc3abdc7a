"""The built wheel carries what an installed Hearth needs: its launcher, its icons and its kernels' source."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(out), str(REPO)],
        check=True,
    )  # fmt: skip
    (built,) = out.glob("hearth-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_wheel_installs_the_hearth_launcher(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    (entry_points_name,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel.read(entry_points_name).decode())

    assert entry_points["gui_scripts"]["hearth"] == "app.main:main"


def test_wheel_ships_the_icons_the_desktop_entry_names(wheel: zipfile.ZipFile) -> None:
    desktop = configparser.ConfigParser(interpolation=None)
    desktop.read(REPO / "packaging" / "hearth.desktop")
    icon = desktop["Desktop Entry"]["Icon"]

    for suffix in (".svg", ".png"):
        shipped = wheel.read(f"hearth_resources/{icon}{suffix}")
        assert shipped == (REPO / "resources" / f"{icon}{suffix}").read_bytes()


def test_icon_svg_renders(qapp: object) -> None:
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(REPO / "resources" / "hearth.svg"))

    assert renderer.isValid()
    assert renderer.defaultSize().width() == renderer.defaultSize().height() == 256


def test_wheel_ships_the_cpu_kernels_source(wheel: zipfile.ZipFile) -> None:
    source = REPO / "engine" / "forward" / "native" / "kernels.c"
    assert wheel.read("engine/forward/native/kernels.c") == source.read_bytes()  # compiled on the user's machine
