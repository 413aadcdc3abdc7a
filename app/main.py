"""Start Hearth: parse arguments, show the window, then start the engine (GUI thread).

The window is on screen before anything heavy happens: this package never imports
torch; the engine thread does, once it starts, after the first paint.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Callable

import qasync
from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.controller import EngineController
from app.models.model_picker import DEFAULT_MODEL
from app.window.main_window import MainWindow
from app.window.quiet_gc import QuietCollector
from engine.service.client import AsyncEngine

RESOURCES_DIR = Path(__file__).resolve().parent.parent / "resources"
ICON_NAMES = ("hearth.svg", "hearth.png")
FIRST_PAINT_DELAY_S = 0.05  # lets Qt paint the window before the engine thread competes for the GIL
ENGINE_STOP_TIMEOUT_S = 5.0
SIGNAL_POLL_MS = 250


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Hearth's own options, and the rest (left for Qt, e.g. ``-platform offscreen``)."""
    parser = argparse.ArgumentParser(prog="hearth", description="Chat with a local language model.")
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="PATH",
        help='a model folder or .gguf file; "default" downloads and uses the built-in model',
    )
    return parser.parse_known_args(argv)


def find_icon() -> QIcon | None:
    for name in ICON_NAMES:
        path = RESOURCES_DIR / name
        if path.is_file():
            return QIcon(str(path))
    return None


def create_application(qt_args: list[str]) -> QApplication:
    app = QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Hearth")
    app.setApplicationDisplayName("Hearth")
    app.setQuitOnLastWindowClosed(False)  # run_window decides when to quit, after stopping the engine
    icon = find_icon()
    if icon is not None:
        app.setWindowIcon(icon)
    return app


async def run_window(model_path: str, engine_factory: Callable[[], AsyncEngine] = AsyncEngine) -> int:
    """Show the window, start the engine, load ``model_path``; return when the window closes."""
    controller = EngineController()
    window = MainWindow(controller)
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    window.show()
    collector = quiet_collector(controller, window)
    _close_on_terminate(window)
    await asyncio.sleep(FIRST_PAINT_DELAY_S)
    controller.start(engine_factory())
    window.model_loader.load(model_path)
    await closed.wait()
    await window.tool_hub.close()  # stops the MCP servers it started
    controller.close(ENGINE_STOP_TIMEOUT_S)
    collector.stop()
    return 0


def quiet_collector(controller: EngineController, parent: QObject) -> QuietCollector:
    """Full garbage collections after replies and loads end, never in the middle of one."""
    quiet_moments = (controller.reply_finished, controller.reply_failed, controller.model_loaded, controller.load_failed)
    return QuietCollector(quiet_moments, parent)


def _close_on_terminate(window: MainWindow) -> None:
    """Ctrl+C or a plain ``kill`` closes the window as the user would: the reply is saved, the engine stops.

    Python runs signal handlers only when it gets control, so a timer hands it control
    a few times a second while Qt waits for events.
    """
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: window.close())
    wake = QTimer(window)
    wake.timeout.connect(lambda: None)
    wake.start(SIGNAL_POLL_MS)


def main(argv: list[str] | None = None) -> int:
    args, qt_args = parse_args(sys.argv[1:] if argv is None else argv)
    app = create_application(qt_args)  # must stay referenced while the loop runs
    exit_code = qasync.run(run_window(args.model))  # asyncio.run on a qasync.QEventLoop
    app.processEvents()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
