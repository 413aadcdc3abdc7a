"""Splits a reply, as it streams, into plain text and the tool calls the model made (any one thread per parser).

``ToolCallParser.feed`` takes each new piece of reply text and returns what is
settled so far: text that cannot be part of a call, and each call once it is
complete and parses (``tool_formats.parse_region``). Text that might still turn
into a call (the start of ``<tool_call>``, or a whole Llama reply beginning
with ``{``) is held back until it is clear. ``finish`` settles the rest at the
end of the reply: a region that is malformed, or was cut off before it closed,
comes back as plain text (``malformed`` then says so), never as an error.
Blank space between text and calls is held and dropped, so a reply that is
only calls has no content.
"""

from __future__ import annotations

import uuid

from engine.chat.tool_formats import MARKERS, parse_region
from engine.protocol.messages import ToolCall

Piece = str | ToolCall
"""What a parser settles: reply text, or one call."""


def new_call_id() -> str:
    """A call id in OpenAI's form, ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Reads one reply of a model whose tool calls follow ``tool_format`` (one of ``tool_formats.FORMATS``)."""

    def __init__(self, tool_format: str, parallel: bool = True) -> None:
        """``parallel`` False keeps only the first call of the reply."""
        self._format = tool_format
        self._markers = MARKERS[tool_format]
        self._parallel = parallel
        self._pending = ""  # text not settled yet
        self._in_region = False  # ``_pending`` starts with a call region's opening marker
        self._said_anything = False  # text or a call was settled: ``at_start`` markers no longer count
        self.calls: list[ToolCall] = []
        self.malformed = False

    def feed(self, text: str) -> list[Piece]:
        """What ``text``, added to what came before, settles."""
        self._pending += text
        settled: list[Piece] = []
        while self._pending:
            progress = self._settle_region(settled) if self._in_region else self._settle_text(settled)
            if not progress:
                break
        return settled

    def finish(self) -> list[Piece]:
        """Settle everything still held, at the end of the reply."""
        settled: list[Piece] = []
        if self._in_region:
            self._close_region(self._pending, self._pending, settled)
        elif self._pending.strip() or not self.calls:  # blank space after the last call is not content
            self._emit_text(self._pending, settled)
        self._pending, self._in_region = "", False
        return settled

    def _settle_text(self, settled: list[Piece]) -> bool:
        """Emit the text before the next call region; True when a region was found and entered."""
        if not self._said_anything:
            stripped = self._pending.lstrip()
            if not stripped:
                return False
            if any(stripped.startswith(marker) for marker in self._markers.at_start):
                self._in_region = True
                return True
            if any(marker.startswith(stripped) for marker in self._markers.at_start):
                return False  # "[" might still become "[{"
        start = _first_marker(self._pending, self._markers.opens)
        if start is None:
            held = _marker_prefix_length(self._pending, self._markers.opens)
            sure = self._pending[: len(self._pending) - held].rstrip()  # blank space before a call is not content
            self._emit_text(sure, settled)
            self._pending = self._pending[len(sure):]
            return False
        self._emit_text(self._pending[:start].rstrip(), settled)
        self._pending, self._in_region = self._pending[start:], True
        return True

    def _settle_region(self, settled: list[Piece]) -> bool:
        """Close the region once its closing marker arrived; True when it did."""
        close = self._markers.close
        end = self._pending.find(close) if close else -1
        if end < 0:
            return False
        region, raw = self._pending[:end], self._pending[: end + len(close)]
        self._pending, self._in_region = self._pending[end + len(close):], False
        self._close_region(region, raw, settled)
        return True

    def _close_region(self, region: str, raw: str, settled: list[Piece]) -> None:
        """The calls of ``region``, or ``raw`` as text when it does not parse."""
        calls = parse_region(self._format, region)
        if calls is None:
            self.malformed = True
            self._emit_text(raw, settled)
            return
        self._said_anything = True
        for name, arguments in calls:
            if self._parallel or not self.calls:
                call = ToolCall(new_call_id(), name, arguments)
                self.calls.append(call)
                settled.append(call)

    def _emit_text(self, text: str, settled: list[Piece]) -> None:
        if text:
            self._said_anything = self._said_anything or bool(text.strip())
            settled.append(text)


def _first_marker(text: str, markers: tuple[str, ...]) -> int | None:
    found = [index for index in (text.find(marker) for marker in markers) if index >= 0]
    return min(found) if found else None


def _marker_prefix_length(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could be the start of a marker."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest


def split_reply(tool_format: str, text: str, parallel: bool = True) -> tuple[str, list[ToolCall], bool]:
    """A whole reply's text (the calls' regions taken out), its calls, and whether a region was malformed."""
    parser = ToolCallParser(tool_format, parallel)
    pieces = parser.feed(text) + parser.finish()
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    return content, parser.calls, parser.malformed
