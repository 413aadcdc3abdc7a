"""The grammar that makes a reply one or more well-formed tool calls (any thread).

``tool_call_grammar`` writes a llguidance Lark grammar: the family's markup
(``tool_formats``) around ``%json{…}``, whose schema admits exactly the offered
functions, each by its name and its own ``parameters`` schema. A reply generated
under it always parses with ``ToolCallParser`` (``tool_choice: required`` or a named
function). Markers that are special tokens (``[TOOL_CALLS]``) are written as plain
text, which is how Hearth's detokenizer shows them and the parser reads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.chat.tool_formats import HERMES_CLOSE, HERMES_OPEN, MISTRAL_CALLS

ANY_OBJECT = {"type": "object"}


def tool_call_grammar(tool_format: str, functions: Sequence[dict], parallel: bool) -> str:
    """A Lark grammar of calls to ``functions`` (OpenAI's ``function`` objects: ``name``, ``parameters``)."""
    if tool_format == "mistral":
        calls = {"type": "array", "items": _any_call(functions, "arguments"), "minItems": 1}
        if not parallel:
            calls["maxItems"] = 1
        return f"start: {_literal(MISTRAL_CALLS)} %json {json.dumps(calls)}\n"
    if tool_format == "llama3":
        call, separator = f"%json {json.dumps(_any_call(functions, 'parameters'))}", _literal("; ")
    else:
        call = f"{_literal(HERMES_OPEN + chr(10))} %json {json.dumps(_any_call(functions, 'arguments'))} "
        call += _literal("\n" + HERMES_CLOSE)
        separator = _literal("\n")
    repeat = f" ({separator} call)*" if parallel else ""
    return f"start: call{repeat}\ncall: {call}\n"


def _any_call(functions: Sequence[dict], arguments_key: str) -> dict:
    """The schema of one call object: ``{"name": <one of the functions>, arguments_key: <its parameters>}``."""
    choices = [{
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: function.get("parameters") or ANY_OBJECT},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    } for function in functions]
    return choices[0] if len(choices) == 1 else {"anyOf": choices}


def _literal(text: str) -> str:
    """``text`` as a Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text)
