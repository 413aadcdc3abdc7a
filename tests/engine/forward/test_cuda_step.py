"""The GPU fast path's fixed-shape decode step, run eagerly on the CPU: same logits and text as the normal forward."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.chat.chat_template import ChatTemplate
from engine.chat.generation import CachedSequence, DecodeLoop, crop_sequence, feed
from engine.forward.cuda_backend import CudaLlama, CudaLlamaBackend, cache_capacity
from engine.forward.cuda_step import FIRST_SPAN, CacheFullError, DecodeStep, StaticKVCache, span_for, spans
from engine.forward.fast_llama import FastLlama
from engine.models.loading import LoadPlan, wrap_model
from engine.models.random_models import build_hf_model, byte_tokenizer
from engine.protocol.messages import GREEDY
from tests.engine.forward.formats import fast_plan

CPU = torch.device("cpu")


def _qwen2_tiny():
    """A tiny Qwen2 (q/k/v biases, grouped-query attention) with seeded random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, use_sliding_window=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)  # nonzero biases, so a bias mistake shows
    return model


def _qwen3_tiny():
    """A tiny Qwen3 (per-head q/k norms, grouped-query attention) with seeded random weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    config = Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)  # not all ones, so a skipped norm shows
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def hf_model(request):
    builders = {"llama": lambda: build_hf_model("tiny", CPU, torch.float32), "qwen2": _qwen2_tiny, "qwen3": _qwen3_tiny}
    return builders[request.param]()


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _prompt(tokenizer, text: str) -> list[int]:
    return tokenizer(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]


def _cuda_llama(hf_model) -> CudaLlama:
    return CudaLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU)


def test_fixed_shape_step_logits_equal_the_forward_pass(hf_model, tokenizer):
    model = _cuda_llama(hf_model)
    prompt = _prompt(tokenizer, "Tell me about lighthouses and the keepers who lived in them.")
    capacity = 2 * FIRST_SPAN
    reference, static = model.new_cache(), StaticKVCache(2, model.kv_heads, model.head_dim, model.dtype, CPU, capacity)
    step = DecodeStep(model, capacity)
    model.forward(torch.tensor(prompt), reference, 0)
    static.reserve(len(prompt))
    model.forward(torch.tensor(prompt), static, 0)
    token, position = 42, len(prompt)
    for _ in range(FIRST_SPAN):  # crosses from the first span into the second
        expected = model.forward(torch.tensor([token]), reference, position)
        step.set_input(token, position)
        got = step(static.buffer, span_for(position + 1, capacity))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        token, position = int(expected.argmax()), position + 1


def _loaded_pair(hf_model, tokenizer):
    """The same weights behind the CPU backend and the GPU backend (graphs off, eager on the CPU)."""
    plan = LoadPlan(Path("random:tiny"), "tiny", CPU, "fp32", 1024, ChatTemplate(tokenizer.chat_template))
    cpu = wrap_model(hf_model, tokenizer, plan, time.perf_counter())
    gpu_backend = CudaLlamaBackend(_cuda_llama(hf_model), capacity=1024, use_graphs=False)
    return cpu, replace(cpu, backend=gpu_backend)


def _reply(loaded, seq, prompt):
    loop = DecodeLoop(loaded.backend, loaded.tokenizer, replace(GREEDY, max_new_tokens=20), frozenset(),
                      loaded.context_length, lambda: False, lambda *_: None, lambda *_: None)
    return loop.run(seq, prompt)


def test_multi_turn_greedy_text_with_reuse_equals_fresh_cache_and_cpu_path(hf_model, tokenizer):
    cpu, gpu = _loaded_pair(hf_model, tokenizer)
    conversation = CachedSequence(gpu.backend.new_cache())
    history = ""
    for turn, question in enumerate(["Hi there!", "What is a lighthouse?", "And who keeps it?", "Thanks, bye."]):
        history += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        prompt = tokenizer(history)["input_ids"]
        reused = _reply(gpu, conversation, prompt)
        fresh = _reply(gpu, CachedSequence(gpu.backend.new_cache()), prompt)
        on_cpu = _reply(cpu, CachedSequence(cpu.backend.new_cache()), prompt)
        assert reused.text == fresh.text == on_cpu.text
        assert reused.reused_tokens > 0 or turn == 0
        history += reused.text + "<|im_end|>\n"


def test_static_cache_keeps_its_buffer_when_cropped_and_refuses_overflow(hf_model):
    backend = CudaLlamaBackend(_cuda_llama(hf_model), capacity=FIRST_SPAN, use_graphs=False)
    seq = CachedSequence(backend.new_cache())
    assert backend.cache_bytes(seq.kv) == 0, "nothing is allocated before the first token"
    feed(backend, seq, list(range(10, 40)))
    address, size = seq.kv.buffer.data_ptr(), backend.cache_bytes(seq.kv)
    crop_sequence(backend, seq, 5)
    feed(backend, seq, [7])
    assert seq.kv.buffer.data_ptr() == address and backend.cache_bytes(seq.kv) == size
    assert seq.kv.length == 6
    with pytest.raises(CacheFullError, match=f"holds {FIRST_SPAN}"):
        feed(backend, seq, list(range(FIRST_SPAN)))


def test_spans_double_up_to_the_capacity():
    assert spans(256) == [256]
    assert spans(3000) == [256, 512, 1024, 2048, 3000]
    assert span_for(1, 3000) == 256 and span_for(257, 3000) == 512 and span_for(2049, 3000) == 3000


def test_cache_capacity_is_the_context_capped_by_memory(hf_model):
    model = _cuda_llama(hf_model)
    per_position = 2 * 2 * model.kv_heads * model.head_dim * 4
    assert cache_capacity(model, 1024, free_bytes=10**12) == 1024
    assert cache_capacity(model, 1024, free_bytes=2 * 600 * per_position) == 512
    assert cache_capacity(model, 100, free_bytes=0) == 100


def test_fast_llama_attention_hook_keeps_cpu_results(hf_model, tokenizer):
    prompt = torch.tensor(_prompt(tokenizer, "Hello"))
    plain = FastLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU)
    gpu_style = _cuda_llama(hf_model)
    expected = plain.forward(prompt, plain.new_cache(), 0)
    torch.testing.assert_close(gpu_style.forward(prompt, gpu_style.new_cache(), 0), expected, rtol=1e-4, atol=1e-4)
