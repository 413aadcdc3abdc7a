"""A ``Constraint`` as llguidance's grammar text, and whether that grammar is sound (any thread).

``grammar_of`` turns each kind of constraint into the grammar llguidance compiles;
``constraint_error`` checks it without a tokenizer, so the API server and the window
can refuse a bad schema, pattern or grammar before the engine sees it. Imports
llguidance alone (no torch), so the GUI may use it.
"""

from __future__ import annotations

import json

from llguidance import LLMatcher

from engine.protocol.messages import CONSTRAINT_KINDS, Constraint

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON as ``json.dumps`` writes it, on one line: with flexible whitespace a small model at temperature 1 spends its
tokens on runs of blank lines (a schema's own ``x-guidance`` options still apply)."""


class ConstraintError(ValueError):
    """A constraint that cannot be compiled; the message says what is wrong with it."""


def grammar_of(constraint: Constraint) -> str:
    """llguidance's grammar for ``constraint``; ``ConstraintError`` for an unknown kind or a malformed spec."""
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(_schema(spec), defaults=JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        return LLMatcher.grammar_from_lark(_choice_lark(spec))
    if kind == "grammar":
        return LLMatcher.grammar_from_lark(spec)
    raise ConstraintError(f"Unknown constraint kind {kind!r}: use one of {', '.join(CONSTRAINT_KINDS)}.")


def constraint_error(constraint: Constraint) -> str | None:
    """Why ``constraint`` cannot be compiled, in words; None when it can."""
    try:
        grammar = grammar_of(constraint)
    except ConstraintError as exc:
        return str(exc)
    message = LLMatcher.validate_grammar(grammar)
    return _readable(constraint.kind, message) if message else None


def _schema(spec: str) -> dict:
    try:
        schema = json.loads(spec)
    except ValueError as exc:
        raise ConstraintError(f"The JSON schema is not valid JSON: {exc}.") from None
    if not isinstance(schema, dict):
        raise ConstraintError("The JSON schema must be a JSON object.")
    return schema


def _choice_lark(spec: str) -> str:
    """``start: "a" | "b"``: the reply is exactly one of the strings (JSON string escapes are Lark's too)."""
    try:
        choices = json.loads(spec)
    except ValueError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ConstraintError("A choice must be a non-empty JSON list of non-empty strings.")
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)


def _readable(kind: str, message: str) -> str:
    what = {"json_schema": "JSON schema", "regex": "regular expression", "grammar": "grammar"}.get(kind, "constraint")
    return f"The {what} cannot be used: {message}"
