"""Sliding-window layers on the fast path: transformers' logits, batched replies as they are alone, a window
group's blocks let go as a sequence grows, and memory counted for the window alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import (Gemma2Config, Gemma3TextConfig, GptOssConfig, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from engine.bench.runner_replies import ReplyDriver
from engine.chat.chat_template import ChatTemplate
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.paged_kv import BatchRow
from engine.forward.windows import KVGroups, layer_windows
from engine.models.loading import LoadPlan, fast_path_applies, wrap_model
from engine.models.memory_estimate import estimate_kv_bytes
from engine.models.random_models import byte_tokenizer
from engine.scheduler.block_pool import BlockPool
from engine.scheduler.scheduler import Scheduler
from engine.service.batch_runner import pool_blocks
from tests.engine.forward.batch_of_one import OneSequence, greedy_tokens, serve_greedy

CPU = torch.device("cpu")
WINDOW = 16
BLOCK = 4
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, tie_word_embeddings=False, initializer_range=0.3, max_position_embeddings=512,
             attn_implementation="eager")
ALTERNATING = ["sliding_attention", "full_attention"] * 2


def _mistral(window: int | None = WINDOW) -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=window)).eval()


def _alternating() -> Qwen2ForCausalLM:
    torch.manual_seed(1)
    config = Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW, layer_types=ALTERNATING)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def models():
    """name -> (transformers' model, Hearth's fast path over the same weights, loaded)."""
    tokenizer = byte_tokenizer()
    built = {"mistral": _mistral(), "alternating": _alternating()}
    wrapped = {}
    for name, model in built.items():
        plan = LoadPlan(Path(name), name, CPU, "fp32", 256, ChatTemplate(tokenizer.chat_template))
        wrapped[name] = (model, wrap_model(model, tokenizer, plan, time.perf_counter()))
    return wrapped


def _ids(length: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_layer_windows_follow_transformers_configs() -> None:
    assert layer_windows(MistralConfig(num_hidden_layers=3, sliding_window=32)) == (32, 32, 32)
    assert layer_windows(MistralConfig(num_hidden_layers=3, sliding_window=None)) == (None,) * 3
    assert layer_windows(Qwen2Config(num_hidden_layers=3, sliding_window=32)) == (None,) * 3  # use_sliding_window off
    qwen = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=32, max_window_layers=2)
    assert layer_windows(qwen) == tuple(32 if kind == "sliding_attention" else None for kind in qwen.layer_types)
    assert layer_windows(qwen) == (None, None, 32, 32)
    for config in (Gemma2Config(num_hidden_layers=4, sliding_window=64), GptOssConfig(num_hidden_layers=4),
                   Gemma3TextConfig(num_hidden_layers=12, sliding_window=512)):
        expected = tuple(config.sliding_window if kind == "sliding_attention" else None for kind in config.layer_types)
        assert layer_windows(config) == expected
        parsed = {k: v for k, v in config.to_dict().items() if k != "layer_types"}  # an older config.json
        assert estimate_kv_bytes(parsed, 100_000, 2) == estimate_kv_bytes(config.to_dict(), 100_000, 2)


def test_a_window_keeps_a_model_on_the_cpus_fast_path_and_off_the_gpus() -> None:
    """The GPU's decode kernel attends whole sequences: such a model runs through transformers there."""
    windowed, whole = MistralConfig(sliding_window=WINDOW), MistralConfig(sliding_window=None)
    assert fast_path_applies(windowed, CPU) and not fast_path_applies(windowed, torch.device("cuda"))
    assert fast_path_applies(whole, torch.device("cuda"))


def test_layers_group_by_kind_in_pages_of_the_smallest_kind() -> None:
    assert KVGroups.of((None,) * 4) == KVGroups((tuple(range(4)),), (None,))
    assert KVGroups.of((8, None, 8, None)) == KVGroups(((1, 3), (0, 2)), (None, 8))
    gemma3 = KVGroups.of(tuple(None if (i + 1) % 6 == 0 else 512 for i in range(26)))
    assert gemma3.page_layers == 4 and gemma3.windows == (None,) + (512,) * 6
    assert gemma3.layers[0] == (5, 11, 17, 23) and gemma3.place(23) == (0, 3) and gemma3.place(25) == (6, 1)


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch-ops"])
@pytest.mark.parametrize("name", ["mistral", "alternating"])
def test_fp32_logits_equal_transformers_past_the_window(models, name, kernels, monkeypatch) -> None:
    """Chunks and single tokens, over 70 positions (the window is 16), each give transformers' logits there."""
    model, loaded = models[name]
    backend = loaded.backend
    assert isinstance(backend, FastLlamaBackend), "a file with a sliding window runs on the fast path"
    if not kernels:
        monkeypatch.setattr(backend.model, "_attention_kernels", False)  # SDPA's mask and two bmm a decode row
    ids = _ids(70, 0)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]  # [S, V]
    sequence, position = OneSequence(backend, 80, BLOCK), 0
    for count in (5, 1, 1, 20, 1, 30, 1, 1, 10):
        logits = sequence.feed(ids[position : position + count])
        position += count
        torch.testing.assert_close(logits, expected[position - 1], atol=1e-4, rtol=1e-4)


def test_the_window_changes_what_transformers_says() -> None:
    """The comparison above can fail: without the window the same weights say something else past it."""
    windowed, whole = _mistral(), _mistral(None)
    ids = torch.tensor([_ids(40, 0)])
    with torch.no_grad():
        assert (windowed(ids).logits[0, -1] - whole(ids).logits[0, -1]).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["mistral", "alternating"])
def test_batched_greedy_replies_equal_each_alone(models, name) -> None:
    backend = models[name][1].backend
    requests = {f"r{i}": (_ids(5 + 13 * i, i), 12, 3 * i) for i in range(4)}
    replies, released = serve_greedy(backend, requests, 200, BLOCK)
    assert released > 0, "window groups let go of blocks while the replies ran"
    for request_id, (prompt, count, _) in requests.items():
        assert replies[request_id] == greedy_tokens(backend, prompt, count), request_id


def test_every_layer_windowed_runs_a_conversation_longer_than_the_pool(models) -> None:
    backend = models["mistral"][1].backend
    prompt = _ids(30, 7)
    replies, _ = serve_greedy(backend, {"long": (prompt, 50, 0)}, 12, BLOCK)  # 80 positions; the pool holds 48
    assert replies["long"] == greedy_tokens(backend, prompt, 50)


def test_the_batch_runner_runs_a_reply_longer_than_its_pool_as_it_does_in_a_large_one(models) -> None:
    """Through the engine's batch runner (its pool sized from a budget of a few blocks): 170 positions in a pool
    of 96, every layer's window 16."""
    loaded = models["mistral"][1]
    small, large = ReplyDriver(loaded, 32, stop_at_eos=False), ReplyDriver(loaded, 1024, stop_at_eos=False)
    assert small.runner.scheduler.pool.num_blocks * 16 < 170
    prompt = _ids(20, 10)
    assert small.reply(prompt, 150).text == large.reply(prompt, 150).text


def test_a_later_turn_reuses_its_cached_window_and_says_what_it_says_alone(models) -> None:
    backend = models["alternating"][1].backend
    first = _ids(38, 8)
    kv = backend.new_pool(100, BLOCK)
    scheduler = Scheduler(BlockPool(100, BLOCK), idle_step_tokens=16, windows=kv.windows)
    for request_id, prompt in (("turn1", first), ("turn2", first + _ids(9, 9))):
        scheduler.add(request_id, prompt)
        while scheduler.get(request_id).pending:
            step = scheduler.schedule()
            for copy in step.copies:
                kv.copy_block(copy.source, copy.target, copy.tokens)
            rows = [BatchRow(c.token_ids, c.start, c.block_ids, c.group_tables) for c in step.chunks]
            logits = backend.forward_batch(rows, kv)[0]
            scheduler.complete(step)
        reused = scheduler.get(request_id).reused
        scheduler.finish(request_id)
    assert reused == 38, "the first turn's prompt, its window's blocks still cached"
    torch.testing.assert_close(logits, OneSequence(backend, 64, BLOCK).feed(first + _ids(9, 9)), atol=1e-4, rtol=1e-4)


def test_memory_counts_a_window_layer_as_its_window() -> None:
    config = {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "sliding_window": 4096}
    per_token_layer = 2 * 8 * 128 * 2
    assert estimate_kv_bytes(config, 32768, 2) == 32 * per_token_layer * (4096 + 256)
    assert estimate_kv_bytes({**config, "sliding_window": None}, 32768, 2) == 32 * per_token_layer * 32768
    assert estimate_kv_bytes(config, 1024, 2) == 32 * per_token_layer * 1024
    huge = 1 << 50
    assert pool_blocks(huge, 1, 32768, 1, (None,)) == 2 * 32768 // 16
    assert pool_blocks(huge, 1, 32768, 1, (None, 4096)) == 2 * (32768 + 4096 + 16) // 16
