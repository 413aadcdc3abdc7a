"""ToolHub over streamable HTTP: a server Hearth did not start, reached by its address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from app.storage.settings import ToolServerConfig

from .conftest import SERVER_SCRIPT


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"the test server did not listen on port {port}")


@pytest.fixture
def http_server(pid_file):
    """The test server serving streamable HTTP; its address."""
    port = _free_port()
    environment = {**os.environ, "HEARTH_TEST_PID_FILE": str(pid_file), "HEARTH_TEST_HTTP_PORT": str(port)}
    process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT)], env=environment, stderr=subprocess.DEVNULL)
    try:
        _wait_until_listening(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def test_an_http_server_lists_answers_and_times_out_like_a_started_one(hub, holder, http_server, run):
    holder.update(tool_servers=(ToolServerConfig("remote", "http", url=http_server),))

    specs = {spec.name: spec for spec in run(hub.tools())}
    added = run(hub.call(specs["add"], {"a": 4, "b": 5}, 10))
    hung = run(hub.call(specs["sleep_forever"], {}, 1))
    again = run(hub.call(specs["add"], {"a": 1, "b": 1}, 10))

    assert (added.status, added.text) == ("done", "9")
    assert hung.status == "timeout" and hung.seconds < 6
    assert (again.status, again.text) == ("done", "2")


def test_an_address_where_nothing_listens_is_a_problem_naming_it(hub, holder, run):
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    holder.update(tool_servers=(ToolServerConfig("nowhere", "http", url=url),))

    assert run(hub.tools()) == ()
    (problem,) = hub.problems()
    assert "“nowhere”" in problem and url in problem
