"""The Jinja sandbox that chat templates run in, and the renderer process around it.

A model's chat template is code written by whoever published the model. It runs in
Jinja's immutable sandbox (as transformers does), with ``*`` and ``**`` capped and
``tojson``'s indent bounded, and it can call only ``raise_exception``,
``strftime_now`` and ``tojson`` beyond Jinja's own safe helpers. The sandbox cannot
bound time or every allocation (string formatting widths, loops), so this module
runs as its own process (``python -m engine.chat.template_sandbox``, started by
``engine.chat.template_renderer``): its address space is capped at
``MEMORY_LIMIT_BYTES`` where ``resource`` exists, and the parent kills it when a
render passes its deadline.

Protocol, one JSON object per line: the process writes ``{"ready": true}`` once,
then answers each request ``{"source": str, "variables": dict | null}`` (null
variables: compile only) with ``{"text": str}`` or ``{"kind": str, "message": str,
"line": int | null}``, ``kind`` being one of ``FAILURE_KINDS``. It imports only
jinja2 and the standard library, and exits when its input closes.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from datetime import datetime
from typing import Any, TextIO

from jinja2 import Template, TemplateError, TemplateSyntaxError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_SEQUENCE_REPEAT_ITEMS = 1_000_000  # largest result of str/list * int a template may build
MAX_EXPONENT = 1_000
MAX_JSON_INDENT = 16
MAX_PROMPT_CHARS = 16_000_000  # a rendered prompt beyond this is a runaway template, not a conversation
MEMORY_LIMIT_BYTES = 512 * 1024**2  # the renderer process's whole address space
CACHED_TEMPLATES = 8
FAILURE_KINDS = ("syntax", "refusal", "security", "memory", "failed")


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
    if isinstance(indent, int) and not 0 <= indent <= MAX_JSON_INDENT:
        raise SecurityError(f"tojson indent {indent} is outside 0..{MAX_JSON_INDENT}")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def make_environment() -> _TemplateSandbox:
    """The sandbox every chat template compiles in."""
    environment = _TemplateSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


class TemplateWorker:
    """Compiles and renders requests; keeps the last few compiled templates (renderer process)."""

    def __init__(self) -> None:
        self._environment = make_environment()
        self._compiled: OrderedDict[str, Template] = OrderedDict()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one request: ``{"text": …}`` or a failure of one of ``FAILURE_KINDS``."""
        try:
            template = self._compile(request["source"])
            if request.get("variables") is None:
                return {"text": ""}
            text = template.render(**request["variables"])
        except TemplateSyntaxError as error:
            return _failure("syntax", error.message or str(error), error.lineno)
        except _TemplateRefusal as error:
            return _failure("refusal", str(error))
        except SecurityError as error:
            return _failure("security", str(error))
        except MemoryError:
            return _failure("memory", "out of memory")
        except Exception as error:  # the template is untrusted code: any failure is its failure
            return _failure("failed", f"{type(error).__name__}: {error}")
        if len(text) > MAX_PROMPT_CHARS:
            return _failure("memory", f"it wrote {len(text)} characters")
        return {"text": text}

    def _compile(self, source: str) -> Template:
        template = self._compiled.pop(source, None) or self._environment.from_string(source)
        self._compiled[source] = template
        while len(self._compiled) > CACHED_TEMPLATES:
            self._compiled.popitem(last=False)
        return template


def _failure(kind: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"kind": kind, "message": message, "line": line}


def limit_memory(limit_bytes: int) -> None:
    """Cap this process's address space where the platform allows (no ``resource`` on Windows)."""
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ValueError, OSError):  # some platforms (macOS) refuse an address-space limit
        pass


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests line by line until ``requests`` closes."""
    worker = TemplateWorker()
    replies.write('{"ready": true}\n')
    replies.flush()
    for line in requests:
        try:
            reply = worker.answer(json.loads(line))
            encoded = json.dumps(reply, ensure_ascii=False)
        except MemoryError:
            encoded = json.dumps(_failure("memory", "out of memory"))
        replies.write(encoded + "\n")
        replies.flush()


if __name__ == "__main__":
    sys.stdin.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    sys.stdout.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    limit_memory(MEMORY_LIMIT_BYTES)
    serve(sys.stdin, sys.stdout)
