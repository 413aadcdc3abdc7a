"""The tool-call grammar, run by llguidance over a byte-level tokenizer: every family's well-formed calls are
accepted and read back by the parser; a call of another function or with wrong arguments is refused."""

from __future__ import annotations

import llguidance
import llguidance.hf
import pytest

from engine.chat.tool_calls import split_reply
from engine.chat.tool_grammar import MAX_CALLS, tool_call_grammar

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
}}
TIME = {"name": "get_time"}  # no parameters: any object


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(['{"name": "get_weather", "arguments": {"city": "Paris"}}'], vocab_size=300,
                            special_tokens=["<|end|>"])
    return llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|end|>"))


def accepts(tokenizer: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("lark", grammar)) == ""
    matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("lark", grammar))
    tokens = tokenizer.tokenize_str(text)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("tool_format, reply", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
])
def test_well_formed_calls_pass_and_parse(tokenizer, tool_format, reply) -> None:
    grammar = tool_call_grammar(tool_format, [WEATHER, TIME], parallel=True)

    assert accepts(tokenizer, grammar, reply)
    _, calls, malformed = split_reply(tool_format, reply)
    assert calls and not malformed


@pytest.mark.parametrize("reply", [
    '<tool_call>\n{"name": "get_stock", "arguments": {"city": "Paris"}}\n</tool_call>',  # not offered
    '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',  # city is required
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>',  # not a string
    "Paris is sunny.",
])
def test_anything_but_a_call_of_an_offered_function_is_refused(tokenizer, reply) -> None:
    assert not accepts(tokenizer, tool_call_grammar("hermes", [WEATHER, TIME], parallel=True), reply)


def test_without_parallel_calls_a_second_call_is_refused(tokenizer) -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    grammar = tool_call_grammar("hermes", [WEATHER], parallel=False)

    assert accepts(tokenizer, grammar, one)
    assert not accepts(tokenizer, grammar, one + "\n" + one)


def test_parallel_calls_stop_at_the_cap(tokenizer) -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    grammar = tool_call_grammar("hermes", [WEATHER], parallel=True)

    assert accepts(tokenizer, grammar, "\n".join([one] * MAX_CALLS))
    assert not accepts(tokenizer, grammar, "\n".join([one] * (MAX_CALLS + 1)))


def test_the_reply_may_end_after_a_call_but_not_inside_one(tokenizer) -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("lark", tool_call_grammar("hermes", [WEATHER], True)))
    ends = []
    for text in (one[:-3], "".join(one[-3:]), "\n"):
        matcher.consume_tokens(tokenizer.tokenize_str(text))
        ends.append(matcher.is_accepting())

    assert ends == [False, True, True]
