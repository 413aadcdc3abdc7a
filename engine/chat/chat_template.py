"""Turn a conversation into the prompt text a model expects (engine thread, or any).

A model's chat template is Jinja code written by whoever published the model, so it
is untrusted: it runs in Jinja's immutable sandbox (as transformers does), with
``*`` and ``**`` capped so a template cannot build huge strings or numbers. It can
call only ``raise_exception``, ``strftime_now`` and the ``tojson`` filter beyond
Jinja's own safe helpers. Templates come from ``chat_template.jinja`` or
``tokenizer_config.json`` in a model folder, or from GGUF metadata.

A model without a template gets ``FALLBACK_TEMPLATE``, a plain transcript::

    System: {system prompt}

    User: {message}

    Assistant: {reply}

    User: {message}

    Assistant:

Plain text suits the base models that usually lack a template (special tokens such
as ``<|im_start|>`` would be meaningless to them). ``ChatTemplate.notice`` then
says so, and ``ChatTemplate.stop_strings`` holds ``"\\nUser:"`` so generation stops
before the model writes the user's next turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from engine.models.model_source import ModelFileError, ModelSource, read_model_json
from engine.protocol.messages import ChatMessage

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_NOTICE = (
    "This model has no chat template, so Hearth writes the conversation as a plain "
    "'User: … / Assistant: …' transcript. Replies may be less reliable than with a chat model."
)
FALLBACK_STOP_STRINGS = ("\nUser:",)
MAX_SEQUENCE_REPEAT_ITEMS = 1_000_000  # largest result of str/list * int a template may build
MAX_EXPONENT = 1_000


class ChatTemplateError(ModelFileError):
    """A chat template that cannot be compiled or rendered; the message names its source."""


class _TemplateRefusal(TemplateError):
    """Raised by a template's own ``raise_exception`` call."""


class _GenerationTag(Extension):
    """Accepts ``{% generation %}…{% endgeneration %}`` (marks assistant text) and renders its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with repetition and exponent sizes bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"exponent {right} is larger than {MAX_EXPONENT}")
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if isinstance(sequence, (str, list, tuple)) and isinstance(times, int):
                    if len(sequence) * times > MAX_SEQUENCE_REPEAT_ITEMS:
                        raise SecurityError("the template tried to build an oversized string or list")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    raise _TemplateRefusal(message)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _make_environment() -> _TemplateSandbox:
    environment = _TemplateSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


_ENVIRONMENT = _make_environment()


class ChatTemplate:
    """A compiled chat template; ``notice`` is text for the user when Hearth uses its fallback."""

    def __init__(self, source: str | None, origin: str | None = None) -> None:
        self.is_fallback = source is None
        self.origin = "Hearth's plain fallback template" if source is None else origin or "the chat template"
        self.notice = FALLBACK_NOTICE if source is None else None
        self.stop_strings: tuple[str, ...] = FALLBACK_STOP_STRINGS if source is None else ()
        try:
            self._template = _ENVIRONMENT.from_string(FALLBACK_TEMPLATE if source is None else source)
        except TemplateSyntaxError as error:
            raise ChatTemplateError(
                f"The chat template in {self.origin} has a syntax error on line {error.lineno}: "
                f"{error.message}. The model's files are broken; pick another copy of the model."
            ) from None

    @classmethod
    def for_model(cls, model: ModelSource) -> ChatTemplate:
        return cls(model.chat_template_source, model.chat_template_origin)

    def render(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        bos_token: str = "",
        eos_token: str = "",
    ) -> str:
        """The prompt text for ``messages``; raises ``ChatTemplateError`` if the template fails."""
        turns = [{"role": message.role, "content": message.content} for message in messages]
        try:
            return self._template.render(
                messages=turns, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
            )
        except _TemplateRefusal as error:
            raise ChatTemplateError(f"The chat template in {self.origin} refused this conversation: {error}") from None
        except SecurityError as error:
            raise ChatTemplateError(
                f"The chat template in {self.origin} tried something Hearth's sandbox blocks ({error}). "
                f"Nothing was run. The template is broken or hostile; pick another copy of the model."
            ) from None
        except Exception as error:  # the template is untrusted code: any failure is its failure
            raise ChatTemplateError(
                f"The chat template in {self.origin} failed: {type(error).__name__}: {error}"
            ) from None


def find_folder_template(folder: Path) -> tuple[str, str] | None:
    """The template text of a model folder and where it came from, or None if it has none.

    ``chat_template.jinja`` wins over ``tokenizer_config.json``; a list of named templates
    in the latter yields the one named "default", or the first if none is.
    """
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.is_file():
        return jinja_path.read_text(encoding="utf-8"), str(jinja_path)
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    tokenizer_config = read_model_json(config_path)
    template = tokenizer_config.get("chat_template") if isinstance(tokenizer_config, dict) else None
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default", next(iter(named.values()), None))
    return (template, str(config_path)) if isinstance(template, str) else None
