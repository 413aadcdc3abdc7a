#!/usr/bin/env bash
# Checks that the system libraries Qt's X11 platform plugin (xcb) needs are installed.
# When some are missing, prints the Debian/Ubuntu packages that provide them and exits 1.
# Usage: packaging/check_qt_libs.sh PYTHON   (the interpreter that has PySide6 installed)
set -euo pipefail

python=${1:-python3}

# The Debian package that ships a library, by its soname.
debian_package() {
    case "$1" in
        libxcb-cursor.so.0) echo libxcb-cursor0 ;;
        libxcb-icccm.so.4) echo libxcb-icccm4 ;;
        libxcb-image.so.0) echo libxcb-image0 ;;
        libxcb-keysyms.so.1) echo libxcb-keysyms1 ;;
        libxcb-render-util.so.0) echo libxcb-render-util0 ;;
        libxcb-util.so.1) echo libxcb-util1 ;;
        libxcb-randr.so.0) echo libxcb-randr0 ;;
        libxcb-render.so.0) echo libxcb-render0 ;;
        libxcb-shape.so.0) echo libxcb-shape0 ;;
        libxcb-shm.so.0) echo libxcb-shm0 ;;
        libxcb-sync.so.1) echo libxcb-sync1 ;;
        libxcb-xfixes.so.0) echo libxcb-xfixes0 ;;
        libxcb-xkb.so.1) echo libxcb-xkb1 ;;
        libxcb.so.1) echo libxcb1 ;;
        libX11-xcb.so.1) echo libx11-xcb1 ;;
        libX11.so.6) echo libx11-6 ;;
        libXau.so.6) echo libxau6 ;;
        libXdmcp.so.6) echo libxdmcp6 ;;
        libxkbcommon.so.0) echo libxkbcommon0 ;;
        libxkbcommon-x11.so.0) echo libxkbcommon-x11-0 ;;
        libGL.so.1 | libGLX.so.0 | libGLdispatch.so.0) echo libgl1 ;;
        libEGL.so.1) echo libegl1 ;;
        libfontconfig.so.1) echo libfontconfig1 ;;
        libfreetype.so.6) echo libfreetype6 ;;
        libpng16.so.16) echo libpng16-16 ;;
        libexpat.so.1) echo libexpat1 ;;
        libglib-2.0.so.0 | libgthread-2.0.so.0) echo libglib2.0-0 ;;
        libdbus-1.so.3) echo libdbus-1-3 ;;
        libzstd.so.1) echo libzstd1 ;;
        libz.so.1) echo zlib1g ;;
        *) echo "(the package that provides $1)" ;;
    esac
}

plugin=$("$python" -c 'import pathlib, PySide6
print(pathlib.Path(PySide6.__file__).parent / "Qt/plugins/platforms/libqxcb.so")')
missing=$(ldd "$plugin" | awk '$3 == "not" && $4 == "found" {print $1}' | sort -u)
if [ -z "$missing" ]; then
    exit 0
fi

packages=$(for lib in $missing; do debian_package "$lib"; done | sort -u | tr '\n' ' ')
{
    echo "Hearth's window cannot open: Qt's X11 plugin is missing system libraries:"
    echo "  $(echo $missing)"
    echo "On Debian or Ubuntu, install them with:"
    echo "  sudo apt-get install ${packages% }"
    echo "(To run without a window system, set QT_QPA_PLATFORM, e.g. QT_QPA_PLATFORM=offscreen.)"
} >&2
exit 1
