"""Assistant replies from Markdown to the HTML subset Qt's rich text shows (any thread).

A reply is cut into chunks that Markdown can render on their own: each fenced code block,
and the prose between them split at blank lines that start a new top-level block. A chunk
that is complete renders the same every time, so its HTML is cached: while a reply streams,
only its last chunk is rendered again. Raw HTML in a reply is shown as text, never
interpreted: a model must not be able to inject markup (or load images) into the window.
Code blocks are rendered by ``code_blocks`` (highlighted, with a Copy link).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import markdown

from app.chat.code_blocks import CODE_FONT, FENCE, LIGHT_CODE, CodeBlock, CodeColours, block_html, closing_fence

_EXTENSIONS = ["tables", "sane_lists", "nl2br"]
_BLOCK_BREAK = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)*(?!\s|[*+-][ \t]|\d+[.)][ \t])")
"""Blank lines followed by a line that can only start a new block (not indented, not a list item)."""


@dataclass(frozen=True)
class Chunk:
    """A piece of a reply that renders on its own: prose, or one fenced code block."""

    source: str
    code: CodeBlock | None = None
    code_index: int = -1
    """The block's position among the reply's code blocks (its Copy link's number); -1 for prose."""


def _converter() -> markdown.Markdown:
    converter = markdown.Markdown(extensions=_EXTENSIONS, output_format="html")
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter


_CONVERTER = _converter()


def split_chunks(text: str) -> list[Chunk]:
    """``text`` as chunks in order; a code fence still open while the reply streams counts as closed."""
    chunks: list[Chunk] = []
    position = 0
    while (opening := FENCE.search(text, position)) is not None:
        chunks.extend(_prose_chunks(text[position : opening.start()]))
        end = closing_fence(opening.group("fence")).search(text, opening.end())
        code_end, resume = (end.start(), end.end()) if end else (len(text), len(text))
        block = CodeBlock(opening.group("lang"), text[opening.end() : code_end].rstrip("\n"))
        code_count = sum(1 for chunk in chunks if chunk.code is not None)
        chunks.append(Chunk(text[opening.start() : resume], block, code_count))
        position = resume
    chunks.extend(_prose_chunks(text[position:]))
    return chunks


def code_blocks(text: str) -> list[CodeBlock]:
    """The fenced code blocks of ``text``, in order (a block's Copy link holds its index here)."""
    return [chunk.code for chunk in split_chunks(text) if chunk.code is not None]


def _prose_chunks(prose: str) -> list[Chunk]:
    return [Chunk(piece) for piece in _BLOCK_BREAK.split(prose) if piece.strip()]


def chunk_html(chunk: Chunk, colours: CodeColours = LIGHT_CODE) -> str:
    """HTML for one chunk; code is monospaced and highlighted."""
    if chunk.code is not None:
        return block_html(chunk.code, chunk.code_index, colours)
    return _prose_html(chunk.source)


@lru_cache(maxsize=4096)
def _prose_html(source: str) -> str:
    _CONVERTER.reset()
    return _CONVERTER.convert(source).replace("<code>", f'<code style="{CODE_FONT}">')


def markdown_to_html(text: str, colours: CodeColours = LIGHT_CODE) -> str:
    """HTML for a whole (possibly unfinished) Markdown reply."""
    return "".join(chunk_html(chunk, colours) for chunk in split_chunks(text))
