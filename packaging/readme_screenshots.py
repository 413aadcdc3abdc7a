"""Takes the README's screenshots from the real app: real window, real engine, built-in model (GUI thread).

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python packaging/readme_screenshots.py resources/

Asks two questions in two conversations (one answered with code), with the performance panel open, then
saves ``screenshot.png`` (the whole window) and ``perf-panel.png`` (the panel) into
the folder given. Uses its own temporary data folder, so it never touches your chats.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import qasync
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.controller import EngineController
from app.storage import SamplingSettings
from app.window.main_window import MainWindow
from engine.models import default_model
from engine.service.client import AsyncEngine

QUESTIONS = (
    "What is the capital of France? Answer in one word.",
    "Write a short Python function that reverses a string.",
)
TIMEOUT_S = 600


async def _until(condition, timeout_s: float = TIMEOUT_S) -> None:
    for _ in range(int(timeout_s * 10)):
        if condition():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the app did not get there in time")


async def take(folder: Path, model: Path) -> None:
    controller = EngineController()
    window = MainWindow(controller)
    window.resize(1280, 800)
    window.show()
    window.performance_dock.show()
    window.settings_holder.update(sampling=SamplingSettings(temperature=0.0))  # greedy: the same pictures every time
    controller.start(AsyncEngine())
    window.model_loader.load(str(model))
    await _until(window.input_bar.send_button.isEnabled)
    for question in QUESTIONS:
        window.conversations.new_conversation()
        window.input_bar.prompt.setPlainText(question)
        window.input_bar.send_button.click()
        await _until(lambda: window.session.generating, 10)
        await _until(lambda: not window.session.generating)
    await asyncio.sleep(1.0)  # a memory sample and a panel refresh
    window.grab().save(str(folder / "screenshot.png"))
    window.performance_dock.grab().save(str(folder / "perf-panel.png"))
    controller.close()
    window.close()


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "resources")
    model = default_model.default_model_path()  # looked up before HEARTH_HOME points elsewhere
    if not model.exists():
        print("Fetch the built-in model first: python -m engine.models.default_model", file=sys.stderr)
        return 1
    os.environ["HEARTH_HOME"] = tempfile.mkdtemp(prefix="hearth-screenshots-")
    app = QApplication(sys.argv[:1])
    app.setAttribute(Qt.ApplicationAttribute.AA_DontUseNativeDialogs)
    qasync.run(take(folder, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
