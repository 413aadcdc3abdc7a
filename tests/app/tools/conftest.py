"""Fixtures for the MCP tool tests: the test server as a configured tool server, a hub, a way to await."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

import psutil
import pytest

from app.settings.app_settings import SettingsHolder
from app.storage.settings import ToolServerConfig
from app.tools.hub import ToolHub

SERVER_SCRIPT = Path(__file__).with_name("mcp_test_server.py")


def server_config(name: str, pid_file: Path) -> ToolServerConfig:
    """The test server (``mcp_test_server.py``) under ``name``, recording its process ids in ``pid_file``."""
    return ToolServerConfig(name, command=sys.executable, args=(str(SERVER_SCRIPT),), env=(("HEARTH_TEST_PID_FILE", str(pid_file)),))


def started_pids(pid_file: Path) -> list[int]:
    """The process ids of the test servers started so far, in order."""
    return [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []


def is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True)
def collect_on_the_gui_thread():
    """Collect earlier tests' garbage here, on the GUI thread, before and after each test.

    Python collects on whichever thread allocates at the wrong moment, and these tests run
    threads (asyncio's child watchers, the SDK import). A closed test loop's timer object
    destroyed there leaves its Qt timer behind, and the next timer event crashes Qt.
    """
    gc.collect()
    yield
    gc.collect()


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "server-pids"


@pytest.fixture
def numbers(pid_file: Path) -> ToolServerConfig:
    return server_config("numbers", pid_file)


@pytest.fixture
def holder(qapp, tmp_path: Path) -> SettingsHolder:
    return SettingsHolder(tmp_path / "settings.json")


@pytest.fixture
def run(qtbot, qasync_loop):
    """Await a coroutine on the qasync loop while pytest-qt spins Qt's loop; returns its result."""

    def run_coroutine(coroutine, timeout_s: float = 60.0):
        task = asyncio.ensure_future(coroutine)
        qtbot.waitUntil(task.done, timeout=int(timeout_s * 1000))
        return task.result()

    return run_coroutine


@pytest.fixture
def hub(holder: SettingsHolder, run):
    tool_hub = ToolHub(holder)
    yield tool_hub
    run(tool_hub.close())
