"""Turns a growing list of token ids into text that is safe to show (engine thread).

Decoding token by token breaks multi-byte characters (an emoji spread over several
byte tokens) and drops the spaces some tokenizers attach to the next token. So we
decode a short window that ends at the newest token and emit only what that window
adds, holding back a trailing replacement character until its bytes are complete.
Stop strings are held back the same way: text that could still become a stop
string is not shown until it cannot.

Special tokens are left out of the text, except the markers that open tool calls
(``TOOL_CALL_MARKERS``: Llama's ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]`` and
``[ARGS]``), which ``tool_calls`` needs to see where a call begins.
"""

from __future__ import annotations

from typing import Any, Sequence

_INCOMPLETE = "\ufffd"
TOOL_CALL_MARKERS = frozenset({"<|python_tag|>", "[TOOL_CALLS]", "[ARGS]"})


class IncrementalDetokenizer:
    """Feed token ids with ``push``; each call returns the newly finished text."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self._markers = {token_id: text for text, token_id in added.items() if text in TOOL_CALL_MARKERS}
        self._ids: list[int] = []
        self._prefix_start = 0  # window start: earlier tokens are already shown and settled
        self._read_start = 0  # tokens before this are already shown

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        shown = self._decode(self._ids[self._prefix_start : self._read_start])
        window = self._decode(self._ids[self._prefix_start :])
        if window.endswith(_INCOMPLETE) or len(window) <= len(shown):
            return ""
        self._prefix_start = self._read_start
        self._read_start = len(self._ids)
        return window[len(shown) :]

    def _decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` without special tokens, tool-call markers kept."""
        if not self._markers or not any(token_id in self._markers for token_id in ids):
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        parts, segment = [], []
        for token_id in ids:
            if token_id in self._markers:
                parts += [self._tokenizer.decode(segment, skip_special_tokens=True), self._markers[token_id]]
                segment = []
            else:
                segment.append(token_id)
        return "".join(parts) + self._tokenizer.decode(segment, skip_special_tokens=True)


class StopStringFilter:
    """Passes text through until a stop string appears; holds back a possible start of one."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = [s for s in stop_strings if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text that is safe to show now. After a stop string, ``stopped`` is True and the rest is dropped."""
        if self.stopped:
            return ""
        self._pending += text
        cut = self._first_stop()
        if cut is not None:
            self.stopped = True
            shown, self._pending = self._pending[:cut], ""
            return shown
        keep = self._longest_partial_stop()
        shown = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(shown) :]
        return shown

    def flush(self) -> str:
        """At the end of the reply: whatever was held back is plain text after all."""
        shown, self._pending = ("" if self.stopped else self._pending), ""
        return shown

    def _first_stop(self) -> int | None:
        hits = [self._pending.find(s) for s in self._stops]
        hits = [h for h in hits if h >= 0]
        return min(hits) if hits else None

    def _longest_partial_stop(self) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._pending)), 0, -1):
                if self._pending.endswith(stop[:size]):
                    longest = max(longest, size)
                    break
        return longest
