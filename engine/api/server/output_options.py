"""What a request asks of its reply's form: ``response_format`` and ``logprobs`` (server thread).

The fields are read by pydantic models in strict mode (a string is no number, a
bool no count), as vLLM reads its requests; any refusal becomes a 400 whose ``param``
is the field's path (``response_format.json_schema.name``). A JSON schema is also
compiled (``engine.chat.grammar``) before the engine sees it, so a schema Hearth
cannot follow is a 400 too, never a failed reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.api.server.errors import ApiError
from engine.chat.grammar import constraint_error
from engine.protocol.messages import Constraint

MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat], Field(discriminator="type")]


class ChatOutputFields(_Strict):
    model_config = ConfigDict(extra="ignore")  # the body's other fields are request_fields' and their parsers'
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionOutputFields(_Strict):
    model_config = ConfigDict(extra="ignore")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


@dataclass(frozen=True)
class OutputOptions:
    """``constraint``: what the reply must match (None: free text). ``logprobs``: None for none, else how many
    rivals each token's entry lists (``SamplingParams.logprobs``)."""

    constraint: Constraint | None = None
    logprobs: int | None = None


def chat_output_options(body: dict) -> OutputOptions:
    fields = _validated(ChatOutputFields, body)
    if fields.top_logprobs and not fields.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    logprobs = (fields.top_logprobs or 0) if fields.logprobs else None
    return OutputOptions(_constraint(fields.response_format), logprobs)


def completion_output_options(body: dict) -> OutputOptions:
    return OutputOptions(None, _validated(CompletionOutputFields, body).logprobs)


def _validated(model: type[_Strict], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = _param(error["loc"])
        raise ApiError(400, f"'{param}': {error['msg']}.", param) from None


def _param(loc: tuple) -> str:
    """The field's path as OpenAI names it: the union's tag (``json_schema`` in ``response_format.json_schema.name``)
    is pydantic's, not the request's, and list indices read ``[i]``."""
    parts = list(loc)
    if len(parts) > 1 and parts[0] == "response_format" and parts[1] in ("text", "json_object", "json_schema"):
        del parts[1]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _constraint(response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None) -> Constraint | None:
    if response_format is None or isinstance(response_format, TextFormat):
        return None
    if isinstance(response_format, JsonObjectFormat):
        return Constraint("json_object", "")
    constraint = Constraint("json_schema", json.dumps(response_format.json_schema.schema_))
    problem = constraint_error(constraint)
    if problem:
        raise ApiError(400, problem, "response_format.json_schema.schema")
    return constraint
