"""The performance panel's "Remote server" box: what the server itself reported (GUI thread).

Shown only while the model in use runs on a remote server. The panel's other
reply figures are then what Hearth measured as a client, the network included;
this box holds the server's own: its ``usage`` (prompt tokens, those it had
cached) and, from llama.cpp, its ``timings`` (prefill and decode speed, cache
hits). A figure the server did not report reads "—".
"""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QWidget

from app.perf.format import UNKNOWN, format_count, format_tok_s, format_tokens
from engine.protocol.messages import RemoteFigures

REMOTE_ROWS = (
    ("remote_server", "Server"),
    ("remote_prompt_tokens", "Prompt tokens"),
    ("remote_cached_tokens", "Prompt tokens cached"),
    ("remote_completion_tokens", "Reply tokens"),
    ("remote_prefill_speed", "Prefill speed"),
    ("remote_decode_speed", "Decode speed"),
)


class RemoteFiguresBox(QGroupBox):
    """The server's own figures for the last reply, labelled as remote."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Remote server (as it reports)", parent)
        self.setObjectName("remote_box")
        form = QFormLayout(self)
        self.values: dict[str, QLabel] = {}
        for key, caption in REMOTE_ROWS:
            self.values[key] = QLabel(UNKNOWN, objectName=f"{key}_value", wordWrap=key == "remote_server")
            form.addRow(QLabel(caption), self.values[key])
        self.hide()

    def show_figures(self, server: str, figures: RemoteFigures | None) -> None:
        """``server``: the remote model's server ("" for a local model: the box hides)."""
        self.setVisible(bool(server))
        if not server:
            return
        figures = figures or RemoteFigures(server, "")
        cached = figures.cached_tokens if figures.cached_tokens is not None else figures.cache_n
        texts = {
            "remote_server": server,
            "remote_prompt_tokens": format_tokens(figures.prompt_tokens),
            "remote_cached_tokens": format_tokens(cached),
            "remote_completion_tokens": format_count(figures.completion_tokens),
            "remote_prefill_speed": format_tok_s(figures.prompt_tok_s),
            "remote_decode_speed": format_tok_s(figures.decode_tok_s),
        }
        for key, text in texts.items():
            if self.values[key].text() != text:
                self.values[key].setText(text)
