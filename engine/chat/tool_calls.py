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

Each call settles as a ``CallStart`` (its index in the reply and its function), its
arguments' JSON text in ``CallArguments`` fragments, and the whole ``ToolCall`` with
the same id. Without ``stream_arguments`` all three come together once the call is
whole and parses, so a malformed call can still come back as text. With it (a reply
under the tool-call grammar, which cannot be malformed, only cut short), the start
goes out once the call's name is written and the fragments as the model writes its
arguments; a call cut short (token budget, stop string) stays as far as it got and
never becomes a ``ToolCall``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from engine.chat.tool_formats import MARKERS, parse_region
from engine.protocol.messages import ToolCall

CALL_HEADER = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
"""The start of a call object up to its arguments object, as the tool grammar writes it (name first)."""


@dataclass(frozen=True)
class CallStart:
    """A streamed call whose function is known: the ``index``-th call of the reply."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next fragment of the JSON text of the ``index``-th call's arguments."""

    index: int
    text: str


Piece = str | CallStart | CallArguments | ToolCall
"""What a parser settles: reply text, the start or an arguments fragment of a streamed call, or one whole call."""


def new_call_id() -> str:
    """A call id in OpenAI's form, ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Reads one reply of a model whose tool calls follow ``tool_format`` (one of ``tool_formats.FORMATS``)."""

    def __init__(self, tool_format: str, parallel: bool = True, stream_arguments: bool = False) -> None:
        """``parallel`` False keeps only the first call of the reply; ``stream_arguments``: each call's start and
        arguments go out as they are written (a reply under the tool grammar), not once the call is whole."""
        self._format = tool_format
        self._markers = MARKERS[tool_format]
        self._parallel = parallel
        self._arguments: ArgumentStream | None = ArgumentStream() if stream_arguments else None
        self._started = 0  # calls started in the reply
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
        if self._in_region and self._arguments is not None:
            settled += self._arguments.advance(self._pending, self._start)
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
        """The calls of ``region``, or ``raw`` as text when it does not parse (unless part of it streamed as a call:
        that call stays cut short)."""
        started: list[CallStart] = []
        if self._arguments is not None:
            settled += self._arguments.advance(region, self._start)
            started = self._arguments.close_region()
        calls = parse_region(self._format, region)
        if calls is None:
            self.malformed = True
            if not started:
                self._emit_text(raw, settled)
            return
        self._said_anything = True
        for position, (name, arguments) in enumerate(calls):
            if not self._parallel and self.calls:
                break
            start = started[position] if position < len(started) and started[position].name == name else None
            if start is None:
                start = self._start(name)
                if start is None:
                    break
                settled += [start, CallArguments(start.index, arguments)]
            call = ToolCall(start.id, name, arguments)
            self.calls.append(call)
            settled.append(call)

    def _start(self, name: str) -> CallStart | None:
        """A new call of ``name``; None when the reply may make no more (one call without ``parallel``)."""
        if not self._parallel and self._started:
            return None
        self._started += 1
        return CallStart(self._started - 1, new_call_id(), name)

    def _emit_text(self, text: str, settled: list[Piece]) -> None:
        if text:
            self._said_anything = self._said_anything or bool(text.strip())
            settled.append(text)


class ArgumentStream:
    """The calls of one region of a reply as their text arrives: each call's header (``CALL_HEADER``), then its
    arguments object, which a scan of strings and braces tells the end of."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._started: list[CallStart] = []  # in the current region
        self._position = 0  # of the region: where the scan goes on
        self._open: CallStart | None = None  # the call whose arguments are being scanned
        self._depth = 0
        self._in_string = self._escaped = False

    def advance(self, region: str, start: Callable[[str], CallStart | None]) -> list[Piece]:
        """What ``region`` (its text so far, from its opening marker on) streams beyond what it streamed before;
        ``start`` makes each new call (None: the reply may make no more)."""
        pieces: list[Piece] = []
        while True:
            if self._open is None:
                header = CALL_HEADER.search(region, self._position)
                self._open = start(header.group(1)) if header else None
                if header is None or self._open is None:
                    return pieces
                self._started.append(self._open)
                self._position = header.end()
                pieces.append(self._open)
            begin = self._position
            closed = self._scan(region)
            if self._position > begin:
                pieces.append(CallArguments(self._open.index, region[begin:self._position]))
            if not closed:
                return pieces
            self._open = None

    def close_region(self) -> list[CallStart]:
        """The calls that started in the region now closed; the next region starts afresh."""
        started = self._started
        self._reset()
        return started

    def _scan(self, region: str) -> bool:
        """Move ``_position`` over the arguments' text in ``region``; True when their object closed."""
        for position in range(self._position, len(region)):
            char = region[position]
            if self._escaped:
                self._escaped = False
            elif self._in_string:
                self._escaped = char == "\\"
                self._in_string = char != '"'
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._position = position + 1
                    return True
        self._position = len(region)
        return False


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
