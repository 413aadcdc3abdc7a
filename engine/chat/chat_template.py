"""Turn a conversation into the prompt text a model expects (engine thread, or any).

A model's chat template is Jinja code written by whoever published the model, so it
is untrusted: it is compiled and rendered in Jinja's sandbox inside a separate
renderer process with a deadline and a memory cap (``template_renderer``,
``template_sandbox``), so a hostile template costs at most ``RENDER_DEADLINE_S``
and is refused with a message naming where it came from. Templates come from
``chat_template.jinja`` or ``tokenizer_config.json`` in a model folder, or from
GGUF metadata. ``ChatTemplate.for_model`` also renders ``SAMPLE_CHAT`` so a
template that breaks the limits is refused when the model is opened.

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

from collections.abc import Sequence
from pathlib import Path

from engine.chat.template_renderer import RENDERER, RenderFailure
from engine.chat.template_sandbox import MEMORY_LIMIT_BYTES
from engine.chat.tool_formats import detect_tool_format, template_shows_tools
from engine.chat.tool_prompt import template_turns
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
SAMPLE_CHAT = (
    ChatMessage("user", "Hello!"),
    ChatMessage("assistant", "Hi! How can I help?"),
    ChatMessage("user", "What is the capital of France?"),
)
LOAD_REFUSALS = ("timeout", "crashed", "memory", "security")  # sample-render failures that refuse the model


class ChatTemplateError(ModelFileError):
    """A chat template that cannot be compiled or rendered; the message names its source.

    ``kind`` says why (``template_renderer.RenderFailure.kind``).
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ChatTemplate:
    """A compiled chat template; ``notice`` is text for the user when Hearth uses its fallback."""

    def __init__(self, source: str | None, origin: str | None = None) -> None:
        """Compiles ``source`` (in the renderer process); a syntax error raises ``ChatTemplateError``."""
        self.is_fallback = source is None
        self.origin = "Hearth's plain fallback template" if source is None else origin or "the chat template"
        self.notice = FALLBACK_NOTICE if source is None else None
        self.stop_strings: tuple[str, ...] = FALLBACK_STOP_STRINGS if source is None else ()
        self._source = FALLBACK_TEMPLATE if source is None else source
        self.shows_tools = template_shows_tools(source)
        self.tool_format = detect_tool_format(source) if self.shows_tools else "hermes"
        """How this model writes tool calls (``tool_formats.FORMATS``); "hermes" where Hearth describes the tools."""
        self._run(None)

    @classmethod
    def for_model(cls, model: ModelSource) -> ChatTemplate:
        """The model's template, refused if rendering a sample chat breaks the sandbox's limits."""
        template = cls(model.chat_template_source, model.chat_template_origin)
        try:
            template.render(SAMPLE_CHAT)
        except ChatTemplateError as error:
            if error.kind in LOAD_REFUSALS:
                raise
        return template

    def render(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        bos_token: str = "",
        eos_token: str = "",
        tools: Sequence[str] = (),
    ) -> str:
        """The prompt text for ``messages`` with the functions ``tools`` (each OpenAI's tool object as JSON text)
        offered; raises ``ChatTemplateError`` if the template fails."""
        turns, tool_list = template_turns(messages, tools, self.shows_tools)
        variables: dict[str, object] = {"messages": turns, "add_generation_prompt": add_generation_prompt,
                                        "bos_token": bos_token, "eos_token": eos_token}
        if tool_list:
            variables["tools"] = tool_list
        return self._run(variables)

    def _run(self, variables: dict[str, object] | None) -> str:
        try:
            return RENDERER.render(self._source, variables)
        except RenderFailure as failure:
            raise ChatTemplateError(self._explain(failure), failure.kind) from None

    def _explain(self, failure: RenderFailure) -> str:
        """The user's message for a failed compile or render."""
        broken = "The template is broken or hostile; pick another copy of the model."
        if failure.kind == "syntax":
            return (
                f"The chat template in {self.origin} has a syntax error on line {failure.line}: "
                f"{failure.message}. The model's files are broken; pick another copy of the model."
            )
        if failure.kind == "refusal":
            return f"The chat template in {self.origin} refused this conversation: {failure.message}"
        if failure.kind == "security":
            return (
                f"The chat template in {self.origin} tried something Hearth's sandbox blocks ({failure.message}). "
                f"Nothing was run. {broken}"
            )
        if failure.kind == "timeout":
            return (
                f"This model's chat template took too long to render ({failure.message}; {self.origin}), "
                f"so Hearth stopped it. {broken}"
            )
        if failure.kind in ("memory", "crashed"):
            return (
                f"This model's chat template took too much memory to render (over "
                f"{MEMORY_LIMIT_BYTES // 1024**2} MB; {self.origin}), so Hearth stopped it. {broken}"
            )
        return f"The chat template in {self.origin} failed: {failure.message}"


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
