"""A client that goes away cancels its request at once; requests sent together queue and all complete."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import openai
import pytest

LONG = {"messages": [{"role": "user", "content": "Write a very long story about a dragon and a baker."}],
        "max_tokens": 1000, "temperature": 0}
"""Seconds of the built-in model's work: the tiny random model's 1 000 tokens, drafted, end in a fifth of a second,
before a client's leaving could be seen."""


@pytest.fixture(scope="module")
def client(served_tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_tiny.url, api_key="unused", max_retries=0, timeout=120)


def _outcomes(served) -> dict[str, int]:
    text = urllib.request.urlopen(served.root + "/metrics", timeout=30).read().decode()
    pairs = [line.split("{outcome=\"")[1].split("\"} ") for line in text.splitlines() if line.startswith("hearth_requests_total{")]
    return {name: int(count) for name, count in pairs}


def _wait_for_outcome(served, name: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while _outcomes(served).get(name, 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _outcomes(served).get(name, 0) >= count


def test_a_client_leaving_mid_stream_cancels_and_the_next_request_works(served_default) -> None:
    client = openai.OpenAI(base_url=served_default.url, api_key="unused", max_retries=0, timeout=120)
    cancelled_before = _outcomes(served_default).get("cancelled", 0)
    served_default.hub.forget_submitted()
    stream = client.chat.completions.create(model=served_default.model_id, stream=True, **LONG)
    first_chunks = [next(stream) for _ in range(3)]
    stream.close()

    generate_id, cancel_id = served_default.hub.wait_for_cancel()
    _wait_for_outcome(served_default, "cancelled", cancelled_before + 1)
    after = client.chat.completions.create(model=served_default.model_id, messages=LONG["messages"], max_tokens=4,
                                           temperature=0)

    assert cancel_id == generate_id == first_chunks[0].id
    assert after.choices[0].message.content
    assert after.usage.completion_tokens == 4


def test_a_client_leaving_before_a_whole_reply_cancels_it(served_default) -> None:
    served_default.hub.forget_submitted()
    address = urlsplit(served_default.root)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"model": served_default.model_id, **LONG})
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    time.sleep(0.3)  # the reply is being generated
    connection.close()

    generate_id, cancel_id = served_default.hub.wait_for_cancel()

    assert cancel_id == generate_id


def test_requests_sent_together_queue_and_all_complete(client, served_tiny) -> None:
    def ask(index: int) -> str:
        reply = client.chat.completions.create(
            model=served_tiny.model_id, messages=[{"role": "user", "content": f"Paris {index % 2}"}], max_tokens=8,
            temperature=0,
        )
        return reply.choices[0].message.content

    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(ask, range(4), timeout=120))

    assert all(replies)
    assert replies[0] == replies[2] and replies[1] == replies[3]  # greedy: the same prompt, the same reply
