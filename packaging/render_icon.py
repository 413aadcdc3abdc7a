"""Render resources/hearth.svg to the PNG icon with Qt's SVG renderer (main thread, no window).

Usage: QT_QPA_PLATFORM=offscreen python packaging/render_icon.py [SIZE]
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def render(svg: Path, png: Path, size: int) -> None:
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg} is not a valid SVG file")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    if not image.save(str(png)):
        raise SystemExit(f"could not write {png}")


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    app = QGuiApplication(sys.argv[:1])  # QImage and QPainter need a Gui application
    render(RESOURCES / "hearth.svg", RESOURCES / "hearth.png", size)
    app.quit()


if __name__ == "__main__":
    main()
