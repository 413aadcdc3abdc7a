"""Assistant replies from Markdown to the HTML subset Qt's rich text shows (GUI thread).

Raw HTML in a reply is shown as text, never interpreted: a model must not be able
to inject markup (or load images) into the window.
"""

from __future__ import annotations

import markdown

_EXTENSIONS = ["fenced_code", "tables", "sane_lists", "nl2br"]
CODE_STYLE = "font-family: 'DejaVu Sans Mono', 'Menlo', 'Consolas', monospace;"


def _converter() -> markdown.Markdown:
    converter = markdown.Markdown(extensions=_EXTENSIONS, output_format="html")
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    return converter


_CONVERTER = _converter()


def markdown_to_html(text: str) -> str:
    """HTML for a (possibly unfinished) Markdown reply; code is monospaced.

    A code fence still open while the reply streams is closed, so the code shows as
    code from its first line on.
    """
    if text.count("```") % 2:
        text += "\n```"
    _CONVERTER.reset()
    body = _CONVERTER.convert(text)
    body = body.replace("\n</code></pre>", "</code></pre>")
    body = body.replace("<pre>", f"<pre style=\"{CODE_STYLE} background: #f3f0ea;\">")
    return body.replace("<code>", f"<code style=\"{CODE_STYLE}\">")

