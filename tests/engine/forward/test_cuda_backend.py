"""The GPU fast path run eagerly on the CPU (graphs off): a reply as a batch of one, its prompt chunks on the fused
attention and its decode steps in bucket 1, gives the CPU path's logits and text."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.bench.runner_replies import ReplyDriver
from engine.chat.chat_template import ChatTemplate
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.cuda_backend import CudaLlama, CudaLlamaBackend, cache_capacity
from engine.forward.llama_forward import FastLlama
from engine.models.loading import LoadPlan, wrap_model
from engine.models.random_models import build_hf_model, byte_tokenizer
from tests.engine.forward.batch_of_one import OneSequence
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


def _cpu_backend(hf_model) -> FastLlamaBackend:
    return FastLlamaBackend(FastLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU))


def test_bucket_steps_logits_equal_the_cpu_forward_pass(hf_model, tokenizer):
    gpu_style = CudaLlamaBackend(_cuda_llama(hf_model), capacity=1024, use_graphs=False)
    prompt = _prompt(tokenizer, "Tell me about lighthouses and the keepers who lived in them.")
    on_gpu_path, on_cpu_path = OneSequence(gpu_style, 1024), OneSequence(_cpu_backend(hf_model), 1024)
    torch.testing.assert_close(on_gpu_path.feed(prompt), on_cpu_path.feed(prompt), rtol=1e-4, atol=1e-4)
    token = 42
    for _ in range(40):  # across block boundaries
        expected = on_cpu_path.feed([token])
        torch.testing.assert_close(on_gpu_path.feed([token]), expected, rtol=1e-4, atol=1e-4)
        token = int(expected.argmax())
    assert set(on_gpu_path.kv.steps) == {1}, "every decode step ran as bucket 1's step"


def _loaded_pair(hf_model, tokenizer):
    """The same weights behind the CPU backend and the GPU backend (graphs off, eager on the CPU)."""
    plan = LoadPlan(Path("random:tiny"), "tiny", CPU, "fp32", 1024, ChatTemplate(tokenizer.chat_template))
    cpu = replace(wrap_model(hf_model, tokenizer, plan, time.perf_counter()), eos_ids=frozenset())
    gpu_backend = CudaLlamaBackend(_cuda_llama(hf_model), capacity=1024, use_graphs=False)
    return cpu, replace(cpu, backend=gpu_backend)


def test_multi_turn_greedy_text_with_reuse_equals_a_fresh_pool_and_the_cpu_path(hf_model, tokenizer):
    cpu, gpu = _loaded_pair(hf_model, tokenizer)
    conversation = ReplyDriver(gpu, 1024)
    history = ""
    for turn, question in enumerate(["Hi there!", "What is a lighthouse?", "And who keeps it?", "Thanks, bye."]):
        history += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        prompt = tokenizer(history)["input_ids"]
        reused = conversation.reply(prompt, 20)
        fresh = ReplyDriver(gpu, 1024).reply(prompt, 20)
        on_cpu = ReplyDriver(cpu, 1024).reply(prompt, 20)
        assert reused.text == fresh.text == on_cpu.text
        assert reused.stats.reused_tokens > 0 or turn == 0
        history += reused.text + "<|im_end|>\n"


def test_cache_capacity_is_the_context_capped_by_memory(hf_model):
    model = _cuda_llama(hf_model)
    per_position = 2 * 2 * model.kv_heads * model.head_dim * 4
    assert cache_capacity(model, 1024, free_bytes=10**12) == 1024
    assert cache_capacity(model, 1024, free_bytes=2 * 600 * per_position) == 512
    assert cache_capacity(model, 100, free_bytes=0) == 100


def test_prompt_chunks_on_the_fused_attention_keep_cpu_results(hf_model, tokenizer):
    """A fresh prompt (causal flash attention) and a chunk after cached positions (masked) give the CPU's logits."""
    prompt = _prompt(tokenizer, "Hello, lighthouse keeper")
    gpu_style = OneSequence(CudaLlamaBackend(_cuda_llama(hf_model), capacity=1024, use_graphs=False))
    plain = OneSequence(_cpu_backend(hf_model))
    for chunk in (prompt[:10], prompt[10:]):
        torch.testing.assert_close(gpu_style.feed(chunk), plain.feed(chunk), rtol=1e-4, atol=1e-4)
