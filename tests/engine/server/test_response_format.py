"""``response_format`` and ``logprobs`` through the official ``openai`` client: a JSON schema is followed, whatever
the model would rather say, and each token's log-probability is the model's own."""

from __future__ import annotations

import json
import math
import random
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests.engine.server.test_errors import CHAT, assert_openai_error, call, chat

SCHEMA_COUNT = 20


def _leaf(rng: random.Random) -> dict:
    """A field a 135M model fills in few tokens at temperature 1 (a float's digits have no end a schema can set)."""
    kind = rng.choice(["integer", "count", "enum", "string", "boolean"])
    if kind == "integer":
        return {"type": "integer", "minimum": -50, "maximum": 500}
    if kind == "count":
        return {"type": "number", "enum": [0, 1, 2.5, 10]}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "cat", "dog", "tea"], 3)}
    if kind == "string":
        return {"type": "string", "maxLength": 12}
    return {"type": "boolean"}


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(["id", "name", "size", "colour", "price", "tags", "owner", "ok", "level"], rng.randint(1, 4))
    properties = {}
    for name in names:
        roll = rng.random()
        if roll < 0.2 and depth < 2:
            properties[name] = _object(rng, depth + 1)
        elif roll < 0.4:
            properties[name] = {"type": "array", "items": _leaf(rng), "minItems": 1, "maxItems": 3}
        else:
            properties[name] = _leaf(rng)
    required = rng.sample(names, rng.randint(1, len(names)))
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def random_schemas(count: int, seed: int = 34) -> list[dict]:
    rng = random.Random(seed)
    return [_object(rng, 0) for _ in range(count)]


@pytest.fixture(scope="module")
def client(served_default) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_default.url, api_key="unused", max_retries=0, timeout=600)


def _ask_for(client: openai.OpenAI, schema: dict, seed: int) -> str:
    reply = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Describe something you like."}],
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}},
        temperature=1.0, seed=seed, max_tokens=300,
    )
    assert reply.choices[0].finish_reason == "stop"
    return reply.choices[0].message.content


def test_twenty_random_schemas_are_each_followed_at_temperature_one(client) -> None:
    schemas = random_schemas(SCHEMA_COUNT)
    with ThreadPoolExecutor(8) as pool:  # they share the engine's batch
        replies = list(pool.map(lambda args: _ask_for(client, *args), zip(schemas, range(SCHEMA_COUNT))))

    for schema, text in zip(schemas, replies):
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_answers_a_json_object(client) -> None:
    def ask(seed: int):
        return client.chat.completions.create(
            model="default", response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=200,
            messages=[{"role": "system", "content": "You answer in JSON."},
                      {"role": "user", "content": "Give me a JSON object describing a cat, with its name and age."}],
        ).choices[0]

    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(ask, range(3)))

    assert all(isinstance(json.loads(reply.message.content), dict) for reply in replies)
    assert all(reply.finish_reason == "stop" for reply in replies)


def test_a_streamed_schema_reply_joins_into_valid_json_with_a_logprob_per_token(client) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Is the sky blue?"}], stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
        logprobs=True, top_logprobs=3, max_tokens=50,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]

    jsonschema.validate(json.loads(text), schema)
    assert "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) <= 3 and e.logprob <= 0 for e in entries)


@pytest.mark.parametrize("response_format, param", [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frog"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict"),
])
def test_a_bad_response_format_is_refused_by_its_field(served_default, response_format, param) -> None:
    refused = call(served_default.root, "POST", CHAT, chat(served_default, response_format=response_format))

    assert_openai_error(refused, 400, param)


@pytest.mark.parametrize("fields, param", [
    ({"logprobs": "yes"}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
])
def test_bad_logprobs_fields_are_refused_by_name(served_default, fields, param) -> None:
    assert_openai_error(call(served_default.root, "POST", CHAT, chat(served_default, **fields)), 400, param)


def test_a_response_format_is_refused_when_tool_choice_requires_a_call(served_default) -> None:
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    body = chat(served_default, tools=[tool], tool_choice="required", response_format={"type": "json_object"})

    assert_openai_error(call(served_default.root, "POST", CHAT, body), 400, "response_format")


def test_a_completions_logprobs_count_is_checked(served_default) -> None:
    body = {"model": "default", "prompt": "Once", "max_tokens": 2}

    assert_openai_error(call(served_default.root, "POST", "/v1/completions", {**body, "logprobs": 21}), 400, "logprobs")
    assert_openai_error(call(served_default.root, "POST", "/v1/completions", {**body, "logprobs": True}), 400, "logprobs")


# ---------------------------------------------------------------- log-probabilities against the model itself


@pytest.fixture(scope="module")
def tiny_client(served_tiny) -> openai.OpenAI:
    return openai.OpenAI(base_url=served_tiny.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny_reference(tiny_model_dir):
    """The tiny model in transformers, fp32: ``logprobs(ids)`` → log_softmax of the next token's logits [V]."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def logprobs(ids: list[int]) -> list[float]:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1).tolist()

    return tokenizer, logprobs


def _token_id(tokenizer, token: str, logprob: float, reference: list[float]) -> int:
    """The vocabulary's token that reads ``token`` and that the reference rates closest to ``logprob``."""
    candidates = [i for i in range(len(reference)) if tokenizer.decode([i]) == token]
    return min(candidates, key=lambda i: abs(reference[i] - logprob))


LOGPROB_TOLERANCE = 1e-2  # the KV cache holds keys and values in bf16 (8 significant bits), the reference in fp32


def test_completion_logprobs_are_the_models_log_softmax_at_temperature_one(tiny_client, tiny_reference) -> None:
    tokenizer, reference_of = tiny_reference
    prompt = "The quick brown fox"
    reply = tiny_client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=1.0, seed=5,
                                           logprobs=3)
    logprobs = reply.choices[0].logprobs

    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        reference = reference_of(ids)
        token_id = _token_id(tokenizer, token, logprob, reference)
        assert logprob == pytest.approx(reference[token_id], abs=LOGPROB_TOLERANCE)
        best = sorted(reference, reverse=True)[:3]
        assert max(top.values()) == pytest.approx(best[0], abs=LOGPROB_TOLERANCE)  # tokens that read alike share one key
        assert all(any(abs(value - b) < LOGPROB_TOLERANCE for b in best) for value in top.values())
        ids.append(token_id)
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset[0] == 0


def test_chat_logprobs_have_openais_shape_only_when_asked(tiny_client) -> None:
    asked = tiny_client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, logprobs=True, top_logprobs=2, temperature=0)
    plain = tiny_client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, temperature=0)

    entries = asked.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == asked.choices[0].message.content
    assert all(bytes(e.bytes) == e.token.encode() and len(e.top_logprobs) == 2 for e in entries)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in entries)  # greedy: the best one
    assert all(math.isfinite(e.logprob) for e in entries)
    assert plain.choices[0].logprobs is None
