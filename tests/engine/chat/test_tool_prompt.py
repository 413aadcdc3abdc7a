"""Tools and tool turns through real chat templates in the sandbox: Qwen2.5's own tool syntax, and Hermes' form for
a template that knows no tools (the built-in SmolLM2's ChatML)."""

from __future__ import annotations

import json

from engine.chat.chat_template import ChatTemplate
from engine.chat.tool_calls import split_reply
from engine.protocol.messages import ChatMessage, ToolCall

WEATHER = json.dumps({"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}})
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2.5-Instruct's template, shortened to its tool parts (same markup).
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' }}{{- message.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
ROUND_TRIP = (
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage("assistant", "", tool_calls=(CALL,)),
    ChatMessage("tool", '{"temperature": 21}', tool_call_id="call_1", name="get_weather"),
)


def test_a_template_with_tool_syntax_gets_the_tools_and_the_turns_as_it_expects() -> None:
    template = ChatTemplate(QWEN_TOOLS)
    prompt = template.render(ROUND_TRIP, tools=[WEATHER])

    assert template.tool_format == "hermes" and template.shows_tools
    assert '"name": "get_weather"' in prompt.split("</tools>")[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_template_without_tools_gets_them_described_in_hermes_form() -> None:
    template = ChatTemplate(CHATML)
    prompt = template.render((ChatMessage("system", "Be brief."), *ROUND_TRIP), tools=[WEATHER])
    system = prompt.split("<|im_end|>")[0]

    assert not template.shows_tools and template.tool_format == "hermes"
    assert system.startswith("<|im_start|>system\nBe brief.\n\n") and '"name": "get_weather"' in system
    assert "<tool_call>" in system
    assert '<|im_start|>user\n<tool_response>\n{"temperature": 21}\n</tool_response>' in prompt
    _, calls, _ = split_reply("hermes", prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0])
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [("get_weather", {"city": "Paris"})]


def test_without_tools_the_prompt_is_what_it_was() -> None:
    template = ChatTemplate(CHATML)
    chat = (ChatMessage("user", "Hello!"),)
    assert template.render(chat) == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
