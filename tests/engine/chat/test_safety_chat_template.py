"""Chat templates render as the model expects, and hostile templates run nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.chat.chat_template import ChatTemplate, ChatTemplateError, find_folder_template
from engine.models.model_files import inspect_model
from engine.protocol.messages import ChatMessage

CONVERSATION = (
    ChatMessage("user", "Hi there"),
    ChatMessage("assistant", "Hello!"),
    ChatMessage("user", "What is 2+2?"),
)


def test_real_smollm2_template_gives_chatml(default_model_path: Path) -> None:
    template = ChatTemplate.for_model(inspect_model(default_model_path))
    prompt = template.render(CONVERSATION)
    assert template.notice is None
    assert "<|im_start|>user\nHi there<|im_end|>\n" in prompt
    assert "<|im_start|>assistant\nHello!<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert not template.render(CONVERSATION, add_generation_prompt=False).endswith("assistant\n")


def test_model_without_template_gets_plain_fallback_with_notice() -> None:
    template = ChatTemplate(None)
    prompt = template.render((ChatMessage("system", "Be brief."), *CONVERSATION))
    assert prompt == (
        "System: Be brief.\n\nUser: Hi there\n\nAssistant: Hello!\n\nUser: What is 2+2?\n\nAssistant:"
    )
    assert template.is_fallback and template.notice and "no chat template" in template.notice
    assert template.stop_strings == ("\nUser:",)


def test_bos_and_eos_tokens_reach_the_template() -> None:
    template = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    assert template.render(CONVERSATION[:1], bos_token="<s>", eos_token="</s>") == "<s>Hi there</s>"


def test_transformers_helpers_are_available() -> None:
    template = ChatTemplate("{{ strftime_now('%Y') }}|{{ {'a': 'é'} | tojson }}")
    year, payload = template.render(()).split("|")
    assert year.isdigit() and len(year) == 4
    assert payload == '{"a": "é"}'


@pytest.mark.parametrize(
    "hostile",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
        "{{ joiner.__init__.__globals__.os.system('touch {marker}') }}",
        "{{ messages.append(1) }}",
        "{{ 'x' * 10**9 }}",
        "{{ 7 ** (10 ** 8) }}",  # Jinja's ** is left-associative
    ],
)
def test_sandbox_escapes_raise_and_run_nothing(hostile: str, tmp_path: Path) -> None:
    marker = tmp_path / "escaped"
    template = ChatTemplate(hostile.replace("{marker}", str(marker)), "evil/tokenizer_config.json")
    with pytest.raises(ChatTemplateError, match="evil/tokenizer_config.json tried something Hearth's sandbox blocks"):
        template.render(CONVERSATION)
    assert not marker.exists()


def test_syntax_error_names_the_file() -> None:
    with pytest.raises(ChatTemplateError, match="in model/chat_template.jinja has a syntax error on line 2"):
        ChatTemplate("ok\n{% for m in %}", "model/chat_template.jinja")


def test_template_refusal_is_reported() -> None:
    template = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}", "t.jinja")
    with pytest.raises(ChatTemplateError, match="refused this conversation: Conversation roles must alternate"):
        template.render(CONVERSATION)


def test_runtime_failure_is_reported() -> None:
    with pytest.raises(ChatTemplateError, match="t.jinja failed: ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}", "t.jinja").render(CONVERSATION)


def test_generation_tag_is_accepted() -> None:
    template = ChatTemplate("{% generation %}{{ messages[0].content }}{% endgeneration %}")
    assert template.render(CONVERSATION) == "Hi there"


def test_named_template_list_picks_default(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "PLAIN"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert find_folder_template(tmp_path) == ("PLAIN", str(tmp_path / "tokenizer_config.json"))


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "OLD"}))
    (tmp_path / "chat_template.jinja").write_text("NEW")
    assert find_folder_template(tmp_path) == ("NEW", str(tmp_path / "chat_template.jinja"))


def test_folder_without_template(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10}))
    assert find_folder_template(tmp_path) is None
