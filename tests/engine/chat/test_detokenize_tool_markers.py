"""Special tokens stay out of the streamed text, except the markers that open tool calls."""

from __future__ import annotations

from engine.chat.detokenize import IncrementalDetokenizer
from engine.chat.tool_calls import split_reply


def mistral_like_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(['{"name": "get_weather", "arguments": {"city": "Paris"}}'] * 4, vocab_size=300,
                            special_tokens=["</s>", "[TOOL_CALLS]", "[ARGS]", "[INST]"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>",
                                   additional_special_tokens=["[TOOL_CALLS]", "[ARGS]", "[INST]"])


def test_tool_call_markers_are_shown_and_other_special_tokens_are_not() -> None:
    tokenizer = mistral_like_tokenizer()
    ids = tokenizer('[INST][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>', add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer)
    text = "".join(detokenizer.push(token_id) for token_id in ids)

    assert text == '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    assert [call.name for call in split_reply("mistral", text)[1]] == ["get_weather"]
