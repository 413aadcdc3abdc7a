"""The tools of one request and how its reply may use them, from OpenAI's fields or Anthropic's (server thread).

``ToolUse`` is what both APIs agree on: the functions (as OpenAI's tool objects,
which the chat template is given), the choice (``"none"``, ``"auto"``,
``"required"``, ``"named"``), whether several calls may come at once, and, for
``required`` and a named function, the grammar constraint that makes the reply
a call of the right function (``tool_grammar``). With ``"none"`` the tools are
still shown to the model, as OpenAI does, but its reply is read as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine.api.server.errors import ApiError
from engine.chat.tool_calls import ToolCallParser
from engine.chat.tool_grammar import tool_call_grammar
from engine.protocol.messages import Constraint

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolUse:
    """Validated tools: ``tools`` as JSON texts of ``{"type": "function", "function": …}``."""

    tools: tuple[str, ...]
    choice: str
    parallel: bool
    tool_format: str
    constraint: Constraint | None

    def parser(self) -> ToolCallParser | None:
        """A parser for the reply, or None when calls are not read (``choice`` "none"). Under the tool grammar a
        call cannot turn out malformed, so its arguments stream as the model writes them."""
        if self.choice == "none":
            return None
        return ToolCallParser(self.tool_format, self.parallel, stream_arguments=self.constraint is not None)


def tool_use(functions: list[dict], choice: str, named: str, parallel: bool, tool_format: str) -> ToolUse:
    """``ToolUse`` of validated ``functions`` (``name``, ``description``, ``parameters``); ``named`` for "named"."""
    tools = tuple(json.dumps({"type": "function", "function": function}, ensure_ascii=False) for function in functions)
    constraint = None
    if choice in ("required", "named"):
        chosen = [function for function in functions if choice == "required" or function["name"] == named]
        constraint = Constraint("grammar", tool_call_grammar(tool_format, chosen, parallel))
    return ToolUse(tools, choice, parallel, tool_format, constraint)


def check_function(name: Any, description: Any, parameters: Any, param: str) -> dict:
    """One function as the template is given it; a 400 naming ``param`` when a field is wrong."""
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ApiError(400, f"{param} needs a name of 1 to 64 letters, digits, '_' or '-'.", param)
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{param}'s description must be a string.", param)
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(400, f"{param}'s parameters must be a JSON Schema object.", param)
    function: dict = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return function


def parse_openai_tools(body: dict, tool_format: str) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request; None when it offers no tools."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools.", "tools")
    functions = [_openai_function(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    choice, named = _openai_choice(body.get("tool_choice"), functions)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false.", "parallel_tool_calls")
    if not functions:
        return None
    return tool_use(functions, choice, named, parallel is not False, tool_format)


def _openai_function(tool: Any, param: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ApiError(400, f"{param} must be {{\"type\": \"function\", \"function\": {{…}}}}: Hearth calls functions only.",
                       param)
    function = tool["function"]
    return check_function(function.get("name"), function.get("description"), function.get("parameters"), param)


def _openai_choice(value: Any, functions: list[dict]) -> tuple[str, str]:
    if value is None:
        return "auto", ""
    if value in CHOICES:
        if value == "required" and not functions:
            raise ApiError(400, "'tool_choice' is 'required' but 'tools' offers none.", "tool_choice")
        return value, ""
    name = value.get("function", {}).get("name") if isinstance(value, dict) and value.get("type") == "function" else None
    if not isinstance(name, str):
        raise ApiError(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                            "{\"name\": …}}.", "tool_choice")
    if name not in [function["name"] for function in functions]:
        raise ApiError(400, f"'tool_choice' names '{name}', which 'tools' does not offer.", "tool_choice")
    return "named", name
