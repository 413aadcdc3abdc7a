"""The fast path on a real GPU: captured graphs, quantized kernels, loading, out of memory (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.bench.runner_replies import ReplyDriver
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.cuda_backend import CudaLlama, CudaLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.weights.quant import Linear
from engine.forward.weights.quant_int import dequantize_int4, int4_layout, quantize_int4, quantize_int8
from engine.protocol.messages import (
    ChatMessage,
    Generate,
    LoadModel,
    LoadOptions,
    ModelLoaded,
    ReplyFailed,
    SamplingParams,
    TokenStreamed,
)
from tests.engine.forward.batch_of_one import OneSequence
from tests.engine.forward.formats import fast_plan

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def small_model():
    """A small Llama with grouped-query attention and seeded random weights, fp32 on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)
    return LlamaForCausalLM(config).to(CUDA).eval()


def _greedy(backend, prompt, count):
    """A reply as a batch of one: the prompt in one chunk, then ``count`` decode steps."""
    seq = OneSequence(backend, len(prompt) + count)
    logits, tokens, all_logits = seq.feed(prompt), [], []
    for _ in range(count):
        all_logits.append(logits)
        tokens.append(int(logits.argmax()))
        logits = seq.feed([tokens[-1]])
    return tokens, torch.stack(all_logits), seq


def test_captured_graphs_give_the_eager_steps_tokens_across_blocks(small_model):
    model = CudaLlama(small_model.config, small_model.state_dict(), fast_plan(small_model.config, "bf16", CUDA), CUDA)
    graphed, eager = CudaLlamaBackend(model, 1024, use_graphs=True), CudaLlamaBackend(model, 1024, use_graphs=False)
    graphed.check_graphs()
    prompt = list(range(5, 60))
    tokens, logits, seq = _greedy(graphed, prompt, 300)
    expected_tokens, expected_logits, _ = _greedy(eager, prompt, 300)
    assert graphed.runner.disabled_reason is None
    assert set(seq.kv.graphs) == {1}, "a lone reply's decode steps replay bucket 1's graph"
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt, min_cosine", [("int8", 0.99), ("int4", 0.95)])
def test_quantized_logits_stay_near_bf16(small_model, fmt, min_cosine):
    state = small_model.state_dict()
    config = small_model.config
    exact = CudaLlamaBackend(CudaLlama(config, state, fast_plan(config, "bf16", CUDA), CUDA), 1024)
    quantized = CudaLlamaBackend(CudaLlama(config, state, fast_plan(config, fmt, CUDA), CUDA), 1024)
    quantized.check_graphs()
    assert quantized.runner.disabled_reason is None
    prompt = list(range(5, 100))
    _, expected, _ = _greedy(exact, prompt, 20)
    _, got, _ = _greedy(quantized, prompt, 20)
    assert torch.nn.functional.cosine_similarity(got[0], expected[0], dim=0) > min_cosine  # after the prefill
    assert torch.nn.functional.cosine_similarity(got, expected, dim=1).mean() > min_cosine - 0.02


@pytest.mark.parametrize("rows, width", [(6144, 4096), (4096, 14336), (576, 576), (300, 64)])
def test_gpu_kernels_compute_with_exactly_the_quantized_weights(rows, width):
    torch.manual_seed(0)
    weight = torch.randn(rows, width, device=CUDA) / width**0.5
    for tokens in (1, 7):
        x = torch.randn(tokens, width, device=CUDA, dtype=torch.bfloat16)
        q, scales = quantize_int8(weight)
        expected = x.float() @ (q.float() * scales.float().unsqueeze(1)).T
        torch.testing.assert_close(Linear(weight, None, "int8")(x).float(), expected, rtol=2e-2, atol=2e-2)
        layout = int4_layout(rows, width, weight.device)
        if layout:
            restored = dequantize_int4(*quantize_int4(weight, layout[0]), layout[0])
            got = Linear(weight, None, "int4")(x).float()
            torch.testing.assert_close(got, x.float() @ restored.T, rtol=2e-2, atol=2e-2)


def test_prefill_after_cached_positions_matches_plain_attention(small_model):
    state = small_model.state_dict()
    formats = fast_plan(small_model.config, "fp32", CUDA)
    fused = OneSequence(CudaLlamaBackend(CudaLlama(small_model.config, state, formats, CUDA), 1024, use_graphs=False))
    plain = OneSequence(FastLlamaBackend(FastLlama(small_model.config, state, formats, CUDA)))
    for chunk in (list(range(3, 200)), list(range(200, 330))):  # a fresh prompt, then a chunk after it
        torch.testing.assert_close(fused.feed(chunk), plain.feed(chunk), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_a_llama_folder_loads_on_the_gpu_fast_path_and_replies(tiny_model_dir, precision):
    from engine.models.model_open import open_model

    loaded = open_model(str(tiny_model_dir), LoadOptions("cuda", precision), lambda _: None, lambda *_: None, lambda: False)
    assert isinstance(loaded.backend, CudaLlamaBackend)
    assert not any("graphs are off" in notice for notice in loaded.notices)
    replies = [ReplyDriver(loaded, 64, stop_at_eos=False).reply(loaded.tokenize("Hello there"), 16) for _ in range(2)]
    assert replies[0].stats.tokens_generated == 16 and replies[0].text == replies[1].text


def test_out_of_memory_mid_reply_keeps_the_partial_reply(tiny_model_dir, engine_driver, out_of_memory_after):
    limit = out_of_memory_after(CudaLlamaBackend)
    engine = engine_driver()
    try:
        engine.thread.submit(LoadModel("load", str(tiny_model_dir), LoadOptions("cuda", "bf16")))
        assert isinstance(engine.wait_for(ModelLoaded), ModelLoaded)
        history = [ChatMessage("user", "Tell me about the quick brown fox")]
        limit["forwards"] = 6
        engine.thread.submit(Generate("oom", "conv", tuple(history), SamplingParams(temperature=0, max_new_tokens=60)))
        streamed = ""
        while not isinstance(event := engine.wait_for(TokenStreamed, ReplyFailed), ReplyFailed):
            streamed += event.text
        assert "out of memory" in event.message and event.partial_text == streamed and streamed
        limit["forwards"] = None
        history += [ChatMessage("assistant", event.partial_text), ChatMessage("user", "Go on")]
        assert engine.ask("conv", history).reply.stats.tokens_generated > 0
    finally:
        engine.thread.stop()
