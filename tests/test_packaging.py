"""The built wheel carries what an installed Hearth needs: its launcher, its icons, its kernels' sources and their
libraries, which run where no C compiler is."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.forward.native.variants import VARIANTS, architecture
from engine.host.cpu_features import has_flags

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``'s wheel (in this environment: the test needs no network)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True)
    (built,) = out.glob("hearth-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(wheel_path: Path) -> Iterator[zipfile.ZipFile]:
    with zipfile.ZipFile(wheel_path) as archive:
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


def test_wheel_ships_the_cpu_kernels_sources_and_a_library_of_each_variant_of_this_architecture(
        wheel: zipfile.ZipFile) -> None:
    """GCC builds every variant of the machine's architecture (another compiler may leave some out: Hearth then runs
    the best it holds) and none of another's (x86-64's on ARM, ARM's on x86-64), whose sources still ship."""
    for variant in VARIANTS:
        source = variant.source_path()
        assert wheel.read(f"engine/forward/native/{source.name}") == source.read_bytes()
        built = f"engine/forward/native/{variant.library_name()}" in wheel.namelist()
        assert built == (variant.architecture == architecture())


def test_the_wheels_kernels_run_in_a_fresh_environment_without_a_c_compiler(wheel_path: Path, tmp_path: Path) -> None:
    """Installed in a new virtual environment (this one's packages beside it, Hearth only from the wheel), with no
    compiler on PATH and an empty cache, Hearth loads the wheel's library of this CPU's best variant and its RMSNorm
    gives PyTorch's."""
    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True)
    python = environment / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    bare = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "CC", "HEARTH_KERNELS")}
    bare |= {"PATH": str(python.parent), "HEARTH_HOME": str(tmp_path / "home")}  # no compiler; an empty cache
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    str(wheel_path)], check=True, env=bare)  # not this checkout's, which PYTHONPATH may name
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"])  # PyTorch and the rest, not their .pth files
    asks = ("import torch; from engine.forward.native import build, norm; x = torch.randn(3, 576); "
            "same = torch.allclose(norm.rms_norm(x, 1e-5), torch.nn.functional.rms_norm(x, (576,), eps=1e-5), "
            "atol=1e-5); print(build.kernels_variant('cpu'), build.library()._name, same)")
    result = subprocess.run([str(python), "-c", asks], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=bare)
    assert result.returncode == 0, result.stderr
    variant, library, same = result.stdout.split()
    expected = next(variant.name for variant in VARIANTS if has_flags(variant.cpu_flags))
    assert (variant, same) == (expected, "True") and Path(library).parent == Path(site, "engine", "forward", "native")
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("hearth-kernels-*"))  # none built
