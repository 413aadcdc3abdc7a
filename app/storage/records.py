"""Conversations and messages as loaded from the database, and the parsing of their rows (GUI thread).

A row that cannot be understood (unknown role or state, invalid JSON) never stops a load: the
conversation comes back with ``problems`` describing what was skipped, and the row itself stays
in the database untouched.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Literal, get_args

from app.storage.settings import SamplingSettings
from engine.protocol.messages import Role, ToolCall

MessageState = Literal["done", "streaming", "interrupted", "error"]
ToolStatus = Literal["waiting", "running", "done", "error", "timeout", "denied", "stopped", "skipped"]
"""Where a tool call stands: ``waiting`` for the user's approval, ``running`` in the hub, or how it ended
(``skipped``: not run, the reply had reached its limit of tool rounds)."""
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
TOOL_STATUSES: frozenset[str] = frozenset(get_args(ToolStatus))
PENDING_TOOL_STATUSES: frozenset[str] = frozenset({"waiting", "running"})
MESSAGE_STATES: frozenset[str] = frozenset({"done", "streaming", "interrupted", "error"})
FINAL_STATES: frozenset[str] = frozenset({"done", "interrupted", "error"})
UNTITLED = "New conversation"
TITLE_LENGTH = 60


@dataclass(frozen=True)
class ToolTurn:
    """The call a "tool" message answers, and how it went; the message's content is the result the model reads."""

    call_id: str
    function_name: str
    arguments: str
    """The arguments' JSON text, as the model wrote them."""
    status: ToolStatus = "waiting"
    seconds: float = 0.0
    server: str = ""
    """The tool server's name ("" when no server has a tool of that name)."""

    @property
    def pending(self) -> bool:
        return self.status in PENDING_TOOL_STATUSES


@dataclass(frozen=True)
class Message:
    id: str
    conversation_id: str
    position: int
    role: Role
    content: str
    state: MessageState
    created_at: float
    stats: dict[str, Any] | None = None
    dropped_from_context: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools an assistant turn called."""
    tool: ToolTurn | None = None
    """What a "tool" turn answers (None for the other roles)."""


@dataclass(frozen=True)
class ConversationSummary:
    """One line of the conversation list."""

    id: str
    title: str
    created_at: float
    updated_at: float

    @property
    def display_title(self) -> str:
        return self.title or UNTITLED


@dataclass(frozen=True)
class Conversation:
    """A conversation with its messages in order. ``sampling`` None means "use the global defaults"."""

    id: str
    title: str
    title_set_by_user: bool
    created_at: float
    updated_at: float
    system_prompt: str
    sampling: SamplingSettings | None
    deleted_at: float | None
    messages: tuple[Message, ...]
    problems: tuple[str, ...] = ()
    reply_kind: str = "text"
    """Free text ("text"), "json" or "json_schema" (``app.conversations.reply_format``)."""
    reply_schema: str = ""
    use_tools: bool = False

    @property
    def damaged(self) -> bool:
        return bool(self.problems)

    @property
    def damage_reason(self) -> str:
        return "; ".join(self.problems)

    @property
    def display_title(self) -> str:
        return self.title or UNTITLED


def title_from_text(text: str) -> str:
    """A one-line title of at most ``TITLE_LENGTH`` characters from a first user message."""
    line = " ".join(text.split())
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    if " " in cut[TITLE_LENGTH // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "…"


def message_from_row(row: sqlite3.Row) -> tuple[Message | None, list[str]]:
    """The message of a row, or None when it is unusable, with the problems found."""
    where = f"message {row['position']}"
    if row["role"] not in ROLES:
        return None, [f"{where} has an unknown role {row['role']!r} and was skipped"]
    if row["state"] not in MESSAGE_STATES:
        return None, [f"{where} has an unknown state {row['state']!r} and was skipped"]
    stats, problems = _parse_stats(row["stats_json"], where)
    tool_calls, tool = _parse_tool_calls(row["tool_calls_json"]), _parse_tool(row["tool_json"])
    if tool_calls is None or (row["role"] == "tool") != (tool is not None):
        return None, [f"{where} has unreadable tool calls and was skipped"]
    message = Message(
        id=row["id"],
        conversation_id=row["conversation_id"],
        position=row["position"],
        role=row["role"],
        content=row["content"],
        state=row["state"],
        created_at=row["created_at"],
        stats=stats,
        dropped_from_context=bool(row["dropped_from_context"]),
        tool_calls=tool_calls,
        tool=tool,
    )
    return message, problems


def tool_calls_json(calls: tuple[ToolCall, ...]) -> str | None:
    return json.dumps([dataclasses.asdict(call) for call in calls]) if calls else None


def tool_json(turn: ToolTurn) -> str:
    return json.dumps(dataclasses.asdict(turn))


def _parse_tool_calls(text: str | None) -> tuple[ToolCall, ...] | None:
    """The calls of their JSON column; None when it is unreadable."""
    if text is None:
        return ()
    try:
        return tuple(ToolCall(str(call["id"]), str(call["name"]), str(call["arguments"])) for call in json.loads(text))
    except (ValueError, TypeError, KeyError):
        return None


def _parse_tool(text: str | None) -> ToolTurn | None:
    """The tool turn of its JSON column; None when there is none or it is unreadable."""
    if text is None:
        return None
    try:
        turn = ToolTurn(**json.loads(text))
    except (ValueError, TypeError):
        return None
    return turn if turn.status in TOOL_STATUSES else None


def _parse_stats(text: str | None, where: str) -> tuple[dict[str, Any] | None, list[str]]:
    if text is None:
        return None, []
    try:
        stats = json.loads(text)
    except ValueError:
        return None, [f"{where} has unreadable statistics (they were left out)"]
    if not isinstance(stats, dict):
        return None, [f"{where} has unreadable statistics (they were left out)"]
    return stats, []


def parse_sampling(text: str | None) -> tuple[SamplingSettings | None, list[str]]:
    """The conversation's sampling settings from their JSON column."""
    if text is None:
        return None, []
    try:
        return SamplingSettings.from_dict(json.loads(text)), []
    except (ValueError, TypeError) as error:
        return None, [f"its sampling settings are unreadable ({error}); the defaults are used"]


def conversation_from_rows(row: sqlite3.Row, message_rows: list[sqlite3.Row]) -> Conversation:
    sampling, problems = parse_sampling(row["sampling_json"])
    messages: list[Message] = []
    for message_row in message_rows:
        message, message_problems = message_from_row(message_row)
        problems.extend(message_problems)
        if message is not None:
            messages.append(message)
    return Conversation(
        id=row["id"],
        title=row["title"],
        title_set_by_user=bool(row["title_set_by_user"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        system_prompt=row["system_prompt"],
        sampling=sampling,
        deleted_at=row["deleted_at"],
        messages=tuple(messages),
        problems=tuple(problems),
        reply_kind=row["reply_kind"],
        reply_schema=row["reply_schema"],
        use_tools=bool(row["use_tools"]),
    )


def summary_from_row(row: sqlite3.Row) -> ConversationSummary:
    return ConversationSummary(
        id=row["id"], title=row["title"], created_at=row["created_at"], updated_at=row["updated_at"]
    )
