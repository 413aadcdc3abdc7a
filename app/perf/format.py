"""Human-readable text for the performance figures (durations, speeds, sizes, counts).

Pure functions with no Qt: usable on any thread. ``None`` stands for "not known
yet" and is shown as an em dash, never as a made-up zero.
"""

from __future__ import annotations

UNKNOWN = "—"

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

_FINISH_REASONS = {
    "eos": "end of reply",
    "stop_string": "stop string",
    "constraint": "reply format complete",
    "max_tokens": "token limit reached",
    "context_full": "context full",
    "cancelled": "cancelled",
    "error": "error",
}


def format_ms(ms: float | None) -> str:
    """``3.2 ms``, ``120 ms``, ``2.35 s``, ``1 min 05 s``."""
    if ms is None:
        return UNKNOWN
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def format_tok_s(tok_s: float | None) -> str:
    """``8.4 tok/s`` below a hundred, ``1,250 tok/s`` above."""
    if tok_s is None:
        return UNKNOWN
    if tok_s < 100:
        return f"{tok_s:.1f} tok/s"
    return f"{tok_s:,.0f} tok/s"


def format_number(value: float) -> str:
    """A bare axis number: ``0``, ``2.5``, ``40``, ``1,000``."""
    if value >= 10 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}"


def format_bytes(size: int | float | None) -> str:
    """Binary units: ``512 B``, ``37.5 MiB``, ``1.42 GiB``."""
    if size is None:
        return UNKNOWN
    value = float(size)
    unit = 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{value:.0f} B"
    decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{decimals}f} {_BYTE_UNITS[unit]}"


def format_count(count: int | None) -> str:
    """Thousands separated: ``12,345``."""
    if count is None:
        return UNKNOWN
    return f"{count:,}"


def format_blocks(count: int, bytes_per_block: int) -> str:
    """KV-cache blocks and what they hold: ``120 · 30.0 MiB`` (just ``120`` when the block size is unknown)."""
    if bytes_per_block <= 0:
        return format_count(count)
    return f"{count:,} · {format_bytes(count * bytes_per_block)}"


def format_tokens(count: int | None) -> str:
    """``1 token``, ``1,024 tokens``."""
    if count is None:
        return UNKNOWN
    return f"{count:,} token" if count == 1 else f"{count:,} tokens"


def format_drafts(drafted: int, accepted: int) -> str:
    """A reply's speculative drafts: ``31 of 40 accepted (78%)``, or ``none`` when nothing was drafted."""
    if drafted <= 0:
        return "none"
    return f"{accepted:,} of {drafted:,} accepted ({accepted / drafted:.0%})"


def format_per_step(tokens: int, steps: int) -> str:
    """Tokens said per decoding step, ``2.4``; unknown before any step."""
    return f"{tokens / steps:.1f}" if steps > 0 else UNKNOWN


def format_finish_reason(reason: str | None) -> str:
    """Why a reply stopped, in words; ``streaming…`` while it has not."""
    if reason is None:
        return "streaming…"
    return _FINISH_REASONS.get(reason, reason)


def reading_note(read: int, total: int) -> str:
    """What a reply says while the engine reads its long prompt: how far, in tokens."""
    return f"reading the conversation… {100 * read // max(total, 1)} % of {format_tokens(total)}"
