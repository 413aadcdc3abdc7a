"""Runs chat templates in a separate, bounded process (any thread; one render at a time).

``render_in_sandbox`` sends a template and its variables to a persistent renderer
process (``engine.chat.template_sandbox``), started on first use and kept for every
later render, so a render costs one round trip through a pipe. The process's address
space is capped (where the platform has ``resource``) and each render has a
deadline: a render past it kills the process, which is started again on the next
call, so no template holds the caller's thread for longer than ``RENDER_DEADLINE_S``
or takes more than ``template_sandbox.MEMORY_LIMIT_BYTES``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

RENDER_DEADLINE_S = 3.0
START_DEADLINE_S = 60.0  # starting Python and importing jinja2, on a busy machine
SANDBOX_MODULE = "engine.chat.template_sandbox"


class RenderFailure(Exception):
    """A render that did not produce text.

    ``kind``: one of ``template_sandbox.FAILURE_KINDS``, ``"timeout"`` (past the
    deadline), ``"crashed"`` (the process died, most likely out of memory) or
    ``"unavailable"`` (the process did not start).
    """

    def __init__(self, kind: str, message: str, line: int | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.line = line


class _RendererProcess:
    """One running renderer process and the thread that reads its replies."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", SANDBOX_MODULE],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=python_path), encoding="utf-8", bufsize=1,
            )
        except OSError as error:
            raise RenderFailure("unavailable", f"the template renderer process could not start ({error})") from None
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_replies, name="template-renderer-reader", daemon=True).start()
        try:
            ready = self._next_reply(START_DEADLINE_S)
        except RenderFailure:
            ready = None
        if ready is None:
            self.stop()
            raise RenderFailure("unavailable", "the template renderer process did not start")

    def _read_replies(self) -> None:
        """Reader thread: each reply line, then None when the process's output ends (it exited or was killed)."""
        assert self._process.stdout is not None
        with self._process.stdout:
            for line in self._process.stdout:
                self._replies.put(line)
        self._replies.put(None)

    def _next_reply(self, deadline_s: float) -> dict[str, Any] | None:
        try:
            line = self._replies.get(timeout=deadline_s)
        except queue.Empty:
            raise RenderFailure("timeout", f"over {deadline_s:g} s") from None
        return None if line is None else json.loads(line)

    def request(self, message: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """The process's reply to ``message``; ``RenderFailure`` if it passes the deadline or dies."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except OSError:
            raise RenderFailure("crashed", "the template renderer stopped") from None
        reply = self._next_reply(deadline_s)
        if reply is None:
            raise RenderFailure("crashed", "the template renderer stopped")
        return reply

    def stop(self) -> None:
        """Kill the process and wait for it; the reader thread then sees its output end."""
        self._process.kill()
        self._process.wait()
        assert self._process.stdin is not None
        try:
            self._process.stdin.close()
        except OSError:  # a write it never read, to a pipe now broken
            pass


class TemplateRenderer:
    """The renderer process, started when first needed and again after a failure that killed it."""

    def __init__(self, deadline_s: float = RENDER_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._process: _RendererProcess | None = None
        self._lock = threading.Lock()

    def render(self, source: str, variables: dict[str, Any] | None) -> str:
        """``source`` rendered with ``variables`` (None: compile only, returns ""); raises ``RenderFailure``."""
        with self._lock:
            if self._process is None:
                self._process = _RendererProcess()
            try:
                reply = self._process.request({"source": source, "variables": variables}, self.deadline_s)
            except RenderFailure:
                self._stop_process()
                raise
            if reply.get("kind") == "memory":  # a process that ran out of memory is not trusted again
                self._stop_process()
        if "text" in reply:
            return reply["text"]
        raise RenderFailure(reply["kind"], reply["message"], reply.get("line"))

    def close(self) -> None:
        """Stop the process (at exit, or in tests); the next render starts a new one."""
        with self._lock:
            self._stop_process()

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None


RENDERER = TemplateRenderer()
atexit.register(RENDERER.close)
