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

from engine.api.server import request_fields
from engine.api.server.errors import ApiError
from engine.chat.grammar import constraint_error
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
        for index, function in enumerate(functions):
            if function in chosen:
                _check_schema(function, f"tools[{index}]")
        constraint = Constraint("grammar", tool_call_grammar(tool_format, chosen, parallel))
    return ToolUse(tools, choice, parallel, tool_format, constraint)


def _check_schema(function: dict, param: str) -> None:
    """A 400 naming ``param`` when the grammar cannot follow the function's parameters schema."""
    problem = constraint_error(Constraint("json_schema", json.dumps(function["parameters"])))
    if problem:
        raise ApiError(400, f"The tool '{function['name']}' cannot be required: {problem}", param)


def check_function(function: dict, param: str, parameters_key: str) -> dict:
    """One function (``function``, found at ``param``, its schema under ``parameters_key``) as the template is given
    it; a 400 naming the field when one is wrong."""
    name, description, parameters = function.get("name"), function.get("description"), function.get(parameters_key)
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ApiError(400, f"{param}.name must be 1 to 64 letters, digits, '_' or '-'.", f"{param}.name")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{param}.description must be a string.", f"{param}.description")
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(400, f"{param}.{parameters_key} must be a JSON Schema object.", f"{param}.{parameters_key}")
    checked: dict = {"name": name}
    if description is not None:
        checked["description"] = description
    checked["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return checked


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
    request_fields.TOOL.check(tool, param)
    request_fields.FUNCTION.check(tool["function"], f"{param}.function")
    return check_function(tool["function"], f"{param}.function", "parameters")


def _openai_choice(value: Any, functions: list[dict]) -> tuple[str, str]:
    if value is None:
        return "auto", ""
    if value in CHOICES:
        if value == "required" and not functions:
            raise ApiError(400, "'tool_choice' is 'required' but 'tools' offers none.", "tool_choice")
        return value, ""
    named = isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict)
    if named:
        request_fields.NAMED_CHOICE.check(value, "tool_choice")
        request_fields.NAMED_FUNCTION.check(value["function"], "tool_choice.function")
    name = value["function"].get("name") if named else None
    if not isinstance(name, str):
        raise ApiError(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                            "{\"name\": …}}.", "tool_choice")
    if name not in [function["name"] for function in functions]:
        raise ApiError(400, f"'tool_choice' names '{name}', which 'tools' does not offer.", "tool_choice")
    return "named", name
