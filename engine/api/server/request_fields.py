"""Which fields a request body, and each object inside it, may hold; what becomes of the rest (server thread).

Every field of a ``/v1/chat/completions``, ``/v1/completions`` or ``/v1/messages``
body, and of the objects inside it (messages, content parts and blocks, tool calls,
tools, ``tool_choice``, ``stream_options``), is one of four kinds:

* **read**: the endpoint's parser checks its type and range (``openai_schema``,
  ``output_options``, ``tool_use``, ``anthropic_schema``);
* **ignored**: accepted when its type is right, since it changes nothing a local
  server does: ``user``, ``metadata``, ``store``, ``service_tier``,
  ``prompt_cache_key``, ``safety_identifier``, ``stream_options.include_obfuscation``,
  a function's ``strict`` (the tool grammar always follows the schema), an assistant
  turn's ``refusal``, Anthropic's ``cache_control`` and ``citations``;
* **refused**: a feature Hearth lacks, a 400 with code ``unsupported_parameter``
  unless the value asks for nothing (``n: 1``, ``frequency_penalty: 0``,
  ``logit_bias: {}``, ``modalities: ["text"]``, ``echo: false``, ``best_of: 1``,
  ``suffix: ""``, ``functions: []``, ``thinking: {"type": "disabled"}`` …):
  ``audio``, ``modalities``, ``prediction``, ``web_search_options``,
  ``reasoning_effort``, ``verbosity``, the penalties, ``logit_bias``, the legacy
  ``functions``/``function_call``, completions' ``echo``, ``suffix``, ``best_of``,
  and Anthropic's ``thinking``, ``container``, ``mcp_servers``, ``context_management``;
* **unknown**: any other name, a 400 with code ``unknown_parameter``, as OpenAI and
  Anthropic answer one, never silent acceptance.

A ``null`` ignored or refused field is unset. Each refusal names the field's path in
``param`` (``messages[2].tool_calls[0].type``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.api.server.errors import ApiError

Check = Callable[[Any], bool]


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def is_flag(value: Any) -> bool:
    return isinstance(value, bool)


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def is_list(value: Any) -> bool:
    return isinstance(value, list)


def is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def is_string_map(value: Any) -> bool:
    """OpenAI's ``metadata``: string keys to string values."""
    return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())


@dataclass(frozen=True)
class Fields:
    """The fields one kind of object may hold: ``read`` by its parser, ``ignored`` (name → type check) and
    ``refused`` (name → whether the value asks for nothing)."""

    read: frozenset[str]
    ignored: Mapping[str, Check] = field(default_factory=dict)
    refused: Mapping[str, Check] = field(default_factory=dict)

    def check(self, value: dict, where: str = "") -> None:
        """A 400 naming the first field of ``value`` (found at ``where``) that is unknown, refused, or ignored but
        of the wrong type."""
        for name, item in value.items():
            param = f"{where}.{name}" if where else str(name)
            if name in self.read:
                continue
            if name in self.ignored:
                if item is not None and not self.ignored[name](item):
                    raise ApiError(400, f"'{param}' has the wrong type (Hearth ignores it, but checks it).", param)
            elif name in self.refused:
                if item is not None and not self.refused[name](item):
                    raise ApiError(400, f"'{param}' is not supported by Hearth; leave it out.", param,
                                   "unsupported_parameter")
            else:
                raise ApiError(400, f"Unrecognized request argument supplied: '{param}'.", param, "unknown_parameter")


_OPENAI_IGNORED: dict[str, Check] = {
    "user": is_text, "metadata": is_string_map, "store": is_flag, "service_tier": is_text,
    "prompt_cache_key": is_text, "safety_identifier": is_text,
}
_OPENAI_REFUSED: dict[str, Check] = {
    "frequency_penalty": is_zero, "presence_penalty": is_zero, "logit_bias": lambda v: v == {},
}
_SAMPLING = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
                       "top_k", "min_p", "repetition_penalty"})  # the last three: llama-server's and vLLM's extras

CHAT = Fields(
    _SAMPLING | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                 "response_format", "logprobs", "top_logprobs"},
    _OPENAI_IGNORED,
    {**_OPENAI_REFUSED, "functions": lambda v: v == [], "function_call": lambda v: v in ("none", "auto"),
     "modalities": lambda v: v == ["text"], "audio": lambda v: False, "prediction": lambda v: False,
     "web_search_options": lambda v: False, "reasoning_effort": lambda v: False, "verbosity": lambda v: False},
)
COMPLETION = Fields(
    _SAMPLING | {"prompt", "logprobs"},
    _OPENAI_IGNORED,
    {**_OPENAI_REFUSED, "echo": lambda v: v is False, "suffix": lambda v: v in ("", None),
     "best_of": lambda v: v == 1 and not isinstance(v, bool)},
)
STREAM_OPTIONS = Fields(frozenset({"include_usage"}), {"include_obfuscation": is_flag})
MESSAGE = {
    "system": Fields(frozenset({"role", "content"}), {"name": is_text}),
    "developer": Fields(frozenset({"role", "content"}), {"name": is_text}),
    "user": Fields(frozenset({"role", "content"}), {"name": is_text}),
    "assistant": Fields(frozenset({"role", "content", "tool_calls"}), {"name": is_text, "refusal": is_text},
                        {"audio": lambda v: False, "function_call": lambda v: False}),
    "tool": Fields(frozenset({"role", "content", "tool_call_id", "name"})),
}
TEXT_PART = Fields(frozenset({"type", "text"}))
TOOL_CALL = Fields(frozenset({"id", "type", "function"}))
CALLED_FUNCTION = Fields(frozenset({"name", "arguments"}))
TOOL = Fields(frozenset({"type", "function"}))
FUNCTION = Fields(frozenset({"name", "description", "parameters"}), {"strict": is_flag})
NAMED_CHOICE = Fields(frozenset({"type", "function"}))
NAMED_FUNCTION = Fields(frozenset({"name"}))

MESSAGES = Fields(
    frozenset({"model", "messages", "system", "max_tokens", "stream", "stop_sequences", "temperature", "top_k",
               "top_p", "tools", "tool_choice", "thinking"}),
    {"metadata": is_object, "service_tier": is_text},
    {"container": lambda v: False, "mcp_servers": lambda v: v == [], "context_management": lambda v: False},
)
_CACHED = {"cache_control": is_object}
BLOCKS = {
    "text": Fields(frozenset({"type", "text"}), {**_CACHED, "citations": is_list}),
    "tool_use": Fields(frozenset({"type", "id", "name", "input"}), _CACHED),
    "tool_result": Fields(frozenset({"type", "tool_use_id", "content", "is_error"}), _CACHED),
}
ANTHROPIC_MESSAGE = Fields(frozenset({"role", "content"}))
ANTHROPIC_TOOL = Fields(frozenset({"type", "name", "description", "input_schema"}), _CACHED)
ANTHROPIC_CHOICE = Fields(frozenset({"type", "name", "disable_parallel_tool_use"}))
THINKING = Fields(frozenset({"type", "budget_tokens"}))
