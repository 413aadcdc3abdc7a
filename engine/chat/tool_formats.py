"""How each model family writes tool calls, and how to read the calls back out of a reply (any thread).

Three families, named as ``ModelLoaded.tool_format`` carries them:

* ``"hermes"``: Qwen2.5, Qwen3, Hermes and Hearth's own fallback: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``,
  one block per call.
* ``"llama3"``: Llama 3.1 and later: the reply is the call, ``{"name": …, "parameters": {…}}`` (after
  ``<|python_tag|>`` when the detokenizer keeps it); several calls are separated by ``;``.
* ``"mistral"``: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``, or the newer ``[TOOL_CALLS]name[ARGS]{…}``.

``detect_tool_format`` picks the family from the chat template's text. Pure Python, no state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FORMATS = ("hermes", "llama3", "mistral")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


@dataclass(frozen=True)
class CallMarkers:
    """Where a family's calls begin and end in the reply text.

    ``opens``: text that starts a call region anywhere; ``at_start``: text that starts one only as the reply's
    first non-blank characters; ``close``: what ends a region ("" when it runs to the end of the reply).
    """

    opens: tuple[str, ...]
    at_start: tuple[str, ...]
    close: str


MARKERS = {
    "hermes": CallMarkers((HERMES_OPEN,), (), HERMES_CLOSE),
    "llama3": CallMarkers((PYTHON_TAG,), ("{",), ""),
    "mistral": CallMarkers((MISTRAL_CALLS,), ("[{",), ""),
}

ParsedCall = tuple[str, str]
"""A call's function name and the JSON text of its arguments object."""


def detect_tool_format(template_source: str | None) -> str:
    """The family whose tool calls this chat template teaches; ``"hermes"`` when it names none (or is absent)."""
    source = template_source or ""
    if MISTRAL_CALLS in source:
        return "mistral"
    if PYTHON_TAG in source or ("ipython" in source and "parameters" in source):
        return "llama3"
    return "hermes"


def template_shows_tools(template_source: str | None) -> bool:
    """Whether the template renders a ``tools`` list itself (else Hearth describes the tools in a system turn)."""
    return template_source is not None and "tools" in template_source


def parse_region(tool_format: str, region: str) -> list[ParsedCall] | None:
    """The calls in one call region (its opening marker included, its closing one not); None when malformed."""
    try:
        if tool_format == "hermes":
            return [_call(json.loads(region.removeprefix(HERMES_OPEN)))]
        if tool_format == "llama3":
            return _llama_calls(region.strip().removeprefix(PYTHON_TAG))
        return _mistral_calls(region.strip().removeprefix(MISTRAL_CALLS).strip())
    except (ValueError, TypeError, KeyError):
        return None


def _call(value: object, arguments_key: str = "arguments") -> ParsedCall:
    """``{"name": str, arguments_key: object}`` as a ``ParsedCall``; arguments given as JSON text are accepted."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError("a call needs a name")
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("a call's arguments must be an object")
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def _llama_calls(text: str) -> list[ParsedCall]:
    """One or more ``{"name", "parameters"}`` objects, separated by ``;`` or blank space."""
    decoder, calls, position = json.JSONDecoder(), [], 0
    while position < len(text):
        value, position = decoder.raw_decode(text, position)
        calls.append(_call(value, "parameters"))
        position = _skip(text, position, " \t\r\n;")
    if not calls:
        raise ValueError("no call")
    return calls


def _mistral_calls(text: str) -> list[ParsedCall]:
    """``[{…}, …]`` or ``name[ARGS]{…}`` repeated, each after its own ``[TOOL_CALLS]``."""
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list) or not value:
            raise ValueError("no call")
        return [_call(item) for item in value]
    calls = []
    for part in text.split(MISTRAL_CALLS):
        name, separator, arguments = part.strip().partition(MISTRAL_ARGS)
        if not separator or not name.strip():
            raise ValueError("a call needs a name and [ARGS]")
        calls.append(_call({"name": name.strip(), "arguments": json.loads(arguments)}))
    return calls


def _skip(text: str, position: int, characters: str) -> int:
    while position < len(text) and text[position] in characters:
        position += 1
    return position
