"""Assistant replies from Markdown to the HTML subset Qt's rich text shows (GUI thread).

Raw HTML in a reply is shown as text, never interpreted: a model must not be able
to inject markup (or load images) into the window. Fenced code blocks are taken out
before Markdown runs and rendered by ``code_blocks`` (highlighted, with a Copy link).
"""

from __future__ import annotations

import markdown

from app.code_blocks import CODE_FONT, LIGHT_CODE, PLACEHOLDER, CodeColours, block_html, split_fences

_EXTENSIONS = ["tables", "sane_lists", "nl2br"]


def _converter() -> markdown.Markdown:
    converter = markdown.Markdown(extensions=_EXTENSIONS, output_format="html")
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter


_CONVERTER = _converter()


def markdown_to_html(text: str, colours: CodeColours = LIGHT_CODE) -> str:
    """HTML for a (possibly unfinished) Markdown reply; code is monospaced and highlighted.

    A code fence still open while the reply streams is closed, so the code shows as
    code from its first line on.
    """
    prose, blocks = split_fences(text)
    _CONVERTER.reset()
    body = _CONVERTER.convert(prose).replace("<code>", f'<code style="{CODE_FONT}">')
    for index, block in enumerate(blocks):
        placeholder = PLACEHOLDER.format(index=index)
        rendered = block_html(block, index, colours)
        body = body.replace(f"<p>{placeholder}</p>", rendered).replace(placeholder, rendered)
    return body
