"""Fenced code blocks of a reply: highlighted with Pygments, each with a Copy link (any thread).

``block_html`` renders one block for Qt's rich text: a header with the language and a
``copy-code:<index>`` link above the highlighted code. The link's index is the block's
position among the reply's code blocks, which is how a click finds the code to copy.
Lexers, formatters and highlighted code are cached: a streaming reply is rendered many times.
The first lookup of a lexer imports Pygments' registry and the lexer's module, long enough
to stall the window, so ``warm_up`` does that for the languages models write most on a
helper thread, before the first reply needs them.
"""

from __future__ import annotations

import html
import re
import threading
from dataclasses import dataclass
from functools import lru_cache

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

COPY_LINK_PREFIX = "copy-code:"
CODE_FONT = "font-family: 'DejaVu Sans Mono', 'Menlo', 'Consolas', monospace;"
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)[^\n]*\n", re.MULTILINE)


@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str


@dataclass(frozen=True)
class CodeColours:
    """How code blocks look in one theme."""

    pygments_style: str
    background: str
    header: str


LIGHT_CODE = CodeColours("friendly", "#f3f0ea", "#7a7066")
DARK_CODE = CodeColours("monokai", "#1e1f22", "#a89f94")
COMMON_LANGUAGES = ("python", "bash", "javascript", "json", "c", "cpp", "html")
_warm_up_started = threading.Event()


def closing_fence(fence: str) -> re.Pattern[str]:
    """The line that closes a block opened by ``fence`` (the same character, at least as many)."""
    return re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)


@lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer:
    try:
        return get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


def warm_up() -> None:
    """Load the common lexers and both themes' formatters on a helper thread, once per process."""
    if _warm_up_started.is_set():
        return
    _warm_up_started.set()
    threading.Thread(target=_load_common, name="hearth-highlighting", daemon=True).start()


def _load_common() -> None:
    for language in COMMON_LANGUAGES:
        _lexer(language)
    for colours in (LIGHT_CODE, DARK_CODE):
        _formatter(colours.pygments_style)


@lru_cache(maxsize=8)
def _formatter(style: str) -> HtmlFormatter:
    return HtmlFormatter(noclasses=True, nowrap=True, style=style)


@lru_cache(maxsize=512)
def highlighted(block: CodeBlock, colours: CodeColours) -> str:
    """The code as HTML spans with inline colours (no classes: Qt has no style sheet for them).

    Cached: while a reply streams it is re-rendered many times, and only its last block changes.
    """
    return highlight(block.code, _lexer(block.language), _formatter(colours.pygments_style)).rstrip("\n")


def block_html(block: CodeBlock, index: int, colours: CodeColours) -> str:
    """One block as a shaded table: language and Copy link on top, the highlighted code below.

    Long lines wrap: a card has no horizontal scroll bar, and a line cut at its edge could not be read.
    """
    language = html.escape(block.language or "code")
    header = (
        f'<tr><td style="color: {colours.header}; font-size: small;">{language}</td>'
        f'<td align="right" style="font-size: small;"><a href="{COPY_LINK_PREFIX}{index}">Copy code</a></td></tr>'
    )
    code = f'<tr><td colspan="2"><pre style="{CODE_FONT} margin: 0; white-space: pre-wrap;">{highlighted(block, colours)}</pre></td></tr>'
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" style="background-color: {colours.background};">'
        f"{header}{code}</table>"
    )


def code_index(link: str) -> int | None:
    """The block index of a ``copy-code:<n>`` link, or None for any other link."""
    if not link.startswith(COPY_LINK_PREFIX):
        return None
    number = link[len(COPY_LINK_PREFIX) :]
    return int(number) if number.isdigit() else None
