"""What form a conversation's replies take: free text, any JSON object, or JSON that a schema describes (any thread).

The user picks it in the conversation's settings and may paste a JSON schema; the
engine then decodes under the matching ``Constraint``. ``schema_problem`` says in
words why a pasted schema cannot be used, so the dialog refuses it before any reply.
No Qt here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.chat.grammar import constraint_error
from engine.protocol.messages import Constraint

ReplyKind = Literal["text", "json", "json_schema"]
REPLY_KINDS: dict[ReplyKind, str] = {
    "text": "Free text",
    "json": "JSON",
    "json_schema": "JSON matching a schema",
}


@dataclass(frozen=True)
class ReplyFormat:
    """``kind``: one of ``REPLY_KINDS``; ``schema``: the JSON schema's text (used by ``json_schema`` alone)."""

    kind: ReplyKind = "text"
    schema: str = ""

    def constraint(self) -> Constraint | None:
        """The constraint the engine decodes under; None for free text."""
        if self.kind == "json":
            return Constraint("json_object", "")
        if self.kind == "json_schema":
            return Constraint("json_schema", self.schema)
        return None

    def schema_problem(self) -> str:
        """Why the schema cannot be used ("" when it can, or when no schema is needed)."""
        if self.kind != "json_schema":
            return ""
        if not self.schema.strip():
            return "Paste a JSON schema, or choose another reply format."
        return constraint_error(Constraint("json_schema", self.schema)) or ""
