"""The grammar that makes a reply one or more well-formed tool calls (any thread).

``tool_call_grammar`` writes a llguidance Lark grammar: the family's markup
(``tool_formats``) around ``%json{…}``, whose schema admits exactly the offered
functions, each by its name and its own ``parameters`` schema. A reply generated
under it always parses with ``ToolCallParser`` (``tool_choice: required`` or a named
function). Markers that are special tokens (``[TOOL_CALLS]``) are written as plain
text, which is how Hearth's detokenizer shows them and the parser reads them.

The reply may end after any complete call (llguidance then allows end-of-sequence),
also after the separator that would start another one (a model that writes
``</tool_call>\\n`` and then wants to stop is not forced into a new call), and must
end after ``MAX_CALLS``: a small model at temperature 1 otherwise keeps copying its
own calls until its token budget runs out. The JSON is written as ``json.dumps``
writes it (``grammar.JSON_OPTIONS``), on one line, as the tool prompt shows it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.chat.grammar import JSON_OPTIONS
from engine.chat.tool_formats import HERMES_CLOSE, HERMES_OPEN, MISTRAL_CALLS

ANY_OBJECT = {"type": "object"}
MAX_CALLS = 8  # calls in one reply with parallel calls on


def tool_call_grammar(tool_format: str, functions: Sequence[dict], parallel: bool) -> str:
    """A Lark grammar of calls to ``functions`` (OpenAI's ``function`` objects: ``name``, ``parameters``)."""
    most = MAX_CALLS if parallel else 1
    if tool_format == "mistral":
        calls = {"type": "array", "items": _any_call(functions, "arguments"), "minItems": 1, "maxItems": most}
        return f"start: {_literal(MISTRAL_CALLS)} {_json(calls)}\n"
    if tool_format == "llama3":
        call, separator = _json(_any_call(functions, "parameters")), _literal("; ")
    else:
        call = f"{_literal(HERMES_OPEN + chr(10))} {_json(_any_call(functions, 'arguments'))} "
        call += _literal("\n" + HERMES_CLOSE)
        separator = _literal("\n")
    more = f" ({separator} call){{0,{most - 1}}} {separator}?" if parallel else ""
    return f"start: call{more}\ncall: {call}\n"


def _any_call(functions: Sequence[dict], arguments_key: str) -> dict:
    """The schema of one call object: ``{"name": <one of the functions>, arguments_key: <its parameters>}``."""
    choices = [{
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: function.get("parameters") or ANY_OBJECT},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    } for function in functions]
    return choices[0] if len(choices) == 1 else {"anyOf": choices}


def _json(schema: dict) -> str:
    """``%json`` of ``schema``, laid out as ``json.dumps`` lays JSON out."""
    return f"%json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"


def _literal(text: str) -> str:
    """``text`` as a Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text)
