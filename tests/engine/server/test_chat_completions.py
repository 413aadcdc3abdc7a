"""The official ``openai`` client against Hearth's server: replies, streams, usage, stop strings, raw completions."""

from __future__ import annotations

import uuid

import openai
import pytest

HELLO = [{"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def client(served_tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_tiny.url, api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_loaded_model(client, served_tiny) -> None:
    assert [model.id for model in client.models.list()] == [served_tiny.model_id]


def test_streamed_text_equals_the_whole_reply(client, served_tiny) -> None:
    whole = client.chat.completions.create(model=served_tiny.model_id, messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(
        model=served_tiny.model_id, messages=HELLO, max_tokens=12, temperature=0, stream=True,
    ))
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)

    assert whole.choices[0].message.content
    assert streamed == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.usage.completion_tokens <= 12


def test_max_tokens_ends_with_length_and_usage_counts_tokens(client, served_tiny) -> None:
    reply = client.chat.completions.create(
        model=served_tiny.model_id, messages=[{"role": "user", "content": "def main():"}], max_completion_tokens=3,
        temperature=0,
    )
    if reply.choices[0].finish_reason == "length":
        assert reply.usage.completion_tokens == 3
    assert reply.usage.prompt_tokens > 3
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_include_usage_sends_a_last_chunk_without_choices(client, served_tiny) -> None:
    chunks = list(client.chat.completions.create(
        model=served_tiny.model_id, messages=HELLO, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))

    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.prompt_tokens > 0
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_the_next_turn_of_a_chat_reuses_the_cached_prompt(client, served_tiny) -> None:
    system = f"Hearth runs language models. {uuid.uuid4().hex}"  # shared with no earlier request
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Paris is"}]
    reply = client.chat.completions.create(model=served_tiny.model_id, messages=first, max_tokens=6, temperature=0)
    follow_up = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "and the fox?"}]
    again = client.chat.completions.create(model=served_tiny.model_id, messages=follow_up, max_tokens=6, temperature=0)

    # The cache is shared by every conversation: only the template's opening tokens can come from earlier requests.
    assert reply.usage.prompt_tokens_details.cached_tokens < 5
    assert again.usage.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens - 1


def test_a_stop_string_ends_the_reply_before_it(client, served_tiny) -> None:
    free = client.chat.completions.create(model=served_tiny.model_id, messages=HELLO, max_tokens=16, temperature=0)
    text = free.choices[0].message.content
    stop = text.strip()[len(text.strip()) // 2:][:2]  # two characters from the middle of the free reply
    stopped = client.chat.completions.create(model=served_tiny.model_id, messages=HELLO, max_tokens=16, temperature=0,
                                             stop=[stop])

    assert stop not in stopped.choices[0].message.content
    assert text.startswith(stopped.choices[0].message.content)
    assert stopped.choices[0].finish_reason == "stop"


def test_completions_continue_raw_text_without_the_chat_template(client, served_tiny) -> None:
    whole = client.completions.create(model=served_tiny.model_id, prompt="The quick brown", max_tokens=6, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=served_tiny.model_id, prompt="The quick brown", max_tokens=6, temperature=0, stream=True,
    ))
    chat_template_prompt = client.chat.completions.create(
        model=served_tiny.model_id, messages=[{"role": "user", "content": "The quick brown"}], max_tokens=1, temperature=0,
    )

    assert whole.object == "text_completion"
    assert whole.choices[0].text == streamed
    assert whole.usage.prompt_tokens < chat_template_prompt.usage.prompt_tokens  # no <|im_start|>user… around it


def test_the_built_in_model_answers_paris(served_default) -> None:
    client = openai.OpenAI(base_url=served_default.url, api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=served_default.model_id, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20, temperature=0,
    )

    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
