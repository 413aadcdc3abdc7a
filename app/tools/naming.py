"""The function names the model sees for MCP tools: OpenAI's rules, unique across servers (pure)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

MAX_FUNCTION_NAME_CHARS = 64
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def function_names(tools: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Names for ``(server, tool)`` pairs, in order: the tool's own name where no other server has it,
    else ``server_tool``; only letters, digits, ``_`` and ``-``, at most 64 characters, all distinct."""
    own = [_safe(tool) for _server, tool in tools]
    counts = Counter(own)
    wanted = [name if counts[name] == 1 else _safe(f"{server}_{tool}") for name, (server, tool) in zip(own, tools)]
    return _distinct(wanted)


def _safe(name: str) -> str:
    return _NOT_ALLOWED.sub("_", name)[:MAX_FUNCTION_NAME_CHARS] or "tool"


def _distinct(names: list[str]) -> tuple[str, ...]:
    """``names`` with ``_2``, ``_3``… added to any that repeats an earlier one."""
    taken: set[str] = set()
    distinct: list[str] = []
    for name in names:
        candidate, number = name, 2
        while candidate in taken:
            suffix = f"_{number}"
            candidate, number = name[: MAX_FUNCTION_NAME_CHARS - len(suffix)] + suffix, number + 1
        taken.add(candidate)
        distinct.append(candidate)
    return tuple(distinct)
