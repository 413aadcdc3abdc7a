"""The fast Llama path, a reply as a batch of one, gives the same replies as transformers and reuses prefixes correctly."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.bench.runner_replies import ReplyDriver
from engine.chat.chat_template import ChatTemplate
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.native import int4_matmul as native_int4
from engine.forward.weights import int4_prompts
from engine.models.loading import LoadPlan, wrap_model
from engine.models.random_models import build_hf_model, byte_tokenizer
from tests.engine.forward.batch_of_one import greedy_tokens, prompt_logits
from tests.engine.forward.formats import fast_plan

CPU = torch.device("cpu")
PROMPT = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def hf_model():
    return _randomised(build_hf_model("tiny", CPU, torch.float32), "norm.weight")


def _randomised(model, *suffixes):
    """Norm weights start at one and biases at zero; other values show that the repacking keeps the output."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(suffixes):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
    return model


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer(tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True))["input_ids"]


def _wrap(model, tokenizer, name, precision):
    plan = LoadPlan(Path(name), name, CPU, precision, 64, ChatTemplate(tokenizer.chat_template))
    return wrap_model(model, tokenizer, plan, time.perf_counter())


def _fast(hf_model, tokenizer, precision):
    return _wrap(hf_model, tokenizer, "random:tiny", precision)


def test_fp32_greedy_tokens_equal_hf_generate(hf_model, tokenizer, prompt_ids, kernel_variant):
    loaded = _fast(hf_model, tokenizer, "fp32")
    assert isinstance(loaded.backend, FastLlamaBackend)
    expected = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert greedy_tokens(loaded.backend, prompt_ids, 40) == expected[0, len(prompt_ids):].tolist()


def test_qwen2_with_biases_greedy_tokens_equal_hf_generate(tokenizer, prompt_ids):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False, initializer_range=0.3,
                         use_sliding_window=False)
    model = _randomised(Qwen2ForCausalLM(config).eval(), "norm.weight", "proj.bias")
    loaded = _wrap(model, tokenizer, "qwen2", "fp32")
    assert isinstance(loaded.backend, FastLlamaBackend)
    expected = model.generate(torch.tensor([prompt_ids]), max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert greedy_tokens(loaded.backend, prompt_ids, 30) == expected[0, len(prompt_ids):].tolist()


def test_fp16_logits_close_to_fp32_and_text_mostly_same(hf_model, tokenizer, prompt_ids):
    exact, half = _fast(hf_model, tokenizer, "fp32"), _fast(hf_model, tokenizer, "fp16")  # fp16's bytes: test_quant_int
    exact_logits, half_logits = prompt_logits(exact.backend, prompt_ids), prompt_logits(half.backend, prompt_ids)
    assert torch.nn.functional.cosine_similarity(exact_logits, half_logits, dim=0) > 0.99
    same = sum(a == b for a, b in zip(greedy_tokens(exact.backend, prompt_ids, 20), greedy_tokens(half.backend, prompt_ids, 20)))
    assert same >= 16


def test_a_reply_reusing_the_conversations_blocks_equals_a_fresh_pools_reply(hf_model, tokenizer, prompt_ids):
    loaded = replace(_fast(hf_model, tokenizer, "fp32"), eos_ids=frozenset(), context_length=1024)
    conversation = ReplyDriver(loaded, 512)
    first = conversation.reply(prompt_ids, 24)
    follow_up = prompt_ids + tokenizer(first.text + "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n")["input_ids"]
    reused = conversation.reply(follow_up, 24)
    fresh = ReplyDriver(loaded, 512).reply(follow_up, 24)
    assert reused.stats.reused_tokens >= len(prompt_ids) and fresh.stats.reused_tokens == 0
    assert reused.text == fresh.text


def test_other_architectures_fall_back_to_transformers(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).eval()
    loaded = _wrap(model, tokenizer, "gpt2", "fp32")
    assert type(loaded.backend).__name__ == "HFBackend"


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
])
def test_rotations_equal_transformers_rotary_embedding(hf_model, rope):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = hf_model.config.__class__.from_dict({**hf_model.config.to_dict(), "rope_parameters": rope})
    fast = FastLlama(config, _randomised(build_hf_model("tiny", CPU, torch.float32), "norm.weight").state_dict(),
                     fast_plan(config, "fp32", CPU), CPU)
    cos, sin = LlamaRotaryEmbedding(config)(torch.empty(1), torch.arange(300).unsqueeze(0))  # [1, P, hd] each
    half = fast.head_dim // 2
    expected = torch.complex(cos[0, :, :half], sin[0, :, :half]).unsqueeze(1)  # [P, 1, hd/2]
    assert torch.equal(fast.rotations(0, 300)[0], expected)


def test_a_4bit_prompt_on_amx_multiplies_and_attends_in_bf16_within_its_rounding(hf_model, tokenizer, monkeypatch,
                                                                                 host_features):
    """Where 4-bit layers' prompts multiply in bf16 (AMX's tiles, ``native.int4_matmul``), a long prompt's attention runs
    in bf16 too: its last logits move from the exact sums' (the fp32 path) by under a tenth of what the 4-bit weights
    themselves move them from fp32's (this random tiny model is chaotic: 62 % and 3 % measured); an fp32 model's
    prompt stays exactly fp32."""
    if not native_int4.runs_on_amx():
        pytest.skip("no AMX bf16 tiles here")
    prompt = [(7 * i) % 200 + 3 for i in range(300)]  # past the fp32 chunk kernel: SDPA, or the tiles with AMX
    monkeypatch.setattr(int4_prompts, "has_int8_dot", lambda: False)  # without AMX: exact fp32 sums

    def last_logits(precision: str, amx: bool) -> torch.Tensor:
        monkeypatch.setattr(native_int4, "runs_on_amx", lambda: amx)
        monkeypatch.setattr(native_int4, "takes_prompts", lambda: amx)  # else fp32 sums, not the avx512 strips
        host_features(amx_tiles=amx)  # the plan's prompt attention in bf16 beside int4 layers on the tiles
        return prompt_logits(_fast(hf_model, tokenizer, precision).backend, prompt)

    exact = last_logits("fp32", False)
    assert torch.equal(exact, last_logits("fp32", True))
    exact_sums, bf16 = last_logits("int4", False), last_logits("int4", True)
    assert not torch.equal(exact_sums, bf16)
    assert (bf16 - exact_sums).norm() < 0.1 * (exact_sums - exact).norm()
