"""The remote runtime against a real llama.cpp server (llama-cpp-python's ``llama_cpp.server``) with the built-in model.

Marked ``peer``: it runs only where ``<repo>/.peer/bin/python`` can import
``llama_cpp.server``, and is skipped elsewhere (CI has no llama.cpp).
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from engine.protocol.messages import RemoteServer, ReplyFinished, TokenStreamed
from tests.openai_fake import RemoteDriver, free_port

ROOT = Path(__file__).resolve().parents[3]
PEER_PYTHON = ROOT / ".peer" / "bin" / "python"
START_TIMEOUT_S = 120.0

pytestmark = pytest.mark.peer


def _peer_has_llama_server() -> bool:
    if not PEER_PYTHON.exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp.server') is None)"
    return subprocess.run([str(PEER_PYTHON), "-c", probe], capture_output=True, timeout=60).returncode == 0


def _wait_until_serving(base_url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"llama_cpp.server did not answer within {START_TIMEOUT_S:.0f} s")


@pytest.fixture(scope="module")
def llama_server(default_model_path, tmp_path_factory):
    if not _peer_has_llama_server():
        pytest.skip(f"needs llama.cpp's server: {PEER_PYTHON} -m llama_cpp.server")
    port = free_port()
    command = [
        str(PEER_PYTHON), "-m", "llama_cpp.server", "--model", str(default_model_path),
        "--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
    ]
    log = tmp_path_factory.mktemp("llama-server") / "server.log"  # a file: its many log lines would fill a pipe
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(base_url, process, log)
        yield base_url
    finally:
        process.terminate()
        process.wait(10)


def test_llama_cpp_answers_the_capital_of_france_through_the_remote_runtime(llama_server):
    driver = RemoteDriver()
    try:
        loaded = driver.connect(RemoteServer(llama_server), "smollm2")
        finished, before = driver.ask()
    finally:
        driver.thread.stop(5)

    assert loaded.server == llama_server
    assert isinstance(finished, ReplyFinished), finished
    assert "Paris" in finished.text
    assert "".join(e.text for e in before if isinstance(e, TokenStreamed)) == finished.text
    assert finished.stats.tokens_generated > 0 and finished.stats.ttft_ms > 0
