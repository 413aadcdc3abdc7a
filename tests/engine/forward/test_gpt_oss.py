"""gpt-oss in the fast path answers as transformers' own forward does.

A tiny random gpt-oss (``gpt_oss_gguf.tiny_gpt_oss``: attention sinks, biases, YaRN, a window on every other
layer, the clamped SwiGLU, a router with a bias and a softmax over its top k), from a safetensors folder and from a
GGUF file in llama.cpp's layout with MXFP4 experts; prompts longer than the window, then decode steps; several
sequences batched; the memory estimate against what the load holds.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from engine.chat.chat_template import ChatTemplate
from engine.forward import attention
from engine.forward.experts import MixtureOfExperts
from engine.forward.windows import layer_windows
from engine.models.format_plan import formats_for_source
from engine.models.inspection import inspect_for_dialog
from engine.models.loading import LoadPlan, load_model
from engine.models.memory_estimate import KV_POOL_TOKENS, cpu_formats_notice, estimate, estimate_kv_bytes
from engine.models.model_files import inspect_model
from engine.models.random_models import byte_tokenizer
from engine.protocol.messages import LoadOptions
from tests.engine.forward.batch_of_one import OneSequence, greedy_tokens, serve_greedy
from tests.engine.models.gpt_oss_gguf import save_mxfp4_folder, tiny_gpt_oss, write_gpt_oss_gguf

CPU = torch.device("cpu")
WINDOW = 8
PROMPT = [5, 77, 140, 3, 200, 18, 96, 41, 9, 250, 33, 64, 120, 7, 81, 199, 30, 2, 66, 150]  # past the window
FOLLOWING = [44, 12, 230, 91, 5, 17, 101, 63, 8, 240, 19, 72]  # fed one at a time after the prompt


def _load(path: Path, precision: str, eight_bit_source: bool = False):
    plan = LoadPlan(path, path.stem, CPU, precision, 512, ChatTemplate(None, "test"),
                    eight_bit_source=eight_bit_source)
    return load_model(plan, lambda *_: None, lambda: False)


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [S, V]


def _stepwise_logits(backend) -> torch.Tensor:
    """The logits after the prompt and after each of ``FOLLOWING`` fed one decode step at a time, [1 + n, V]."""
    sequence = OneSequence(backend, len(PROMPT) + len(FOLLOWING))
    return torch.stack([sequence.feed(PROMPT)] + [sequence.feed([token]) for token in FOLLOWING])


def _reference(model) -> torch.Tensor:
    return _hf_logits(model, PROMPT + FOLLOWING)[len(PROMPT) - 1 :]  # [1 + n, V]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory):
    """A random model saved as transformers saves it, and the model."""
    model = tiny_gpt_oss(window=WINDOW)
    path = tmp_path_factory.mktemp("gpt-oss")
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def mxfp4_file(tmp_path_factory: pytest.TempPathFactory):
    """The random model as a GGUF file with MXFP4 experts, and the model over the weights its blocks stand for."""
    model = tiny_gpt_oss(window=WINDOW)
    return write_gpt_oss_gguf(tmp_path_factory.mktemp("gpt-oss-gguf") / "gpt-oss.gguf", model), model


def test_fp32_from_a_safetensors_folder_equals_transformers(folder):
    path, model = folder
    loaded = _load(path, "fp32")
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    assert all(isinstance(layer.mlp, MixtureOfExperts) for layer in loaded.model.layers)
    torch.testing.assert_close(_stepwise_logits(loaded.backend), _reference(model), atol=1e-4, rtol=1e-4)


def test_fp32_from_a_gguf_file_keeps_its_mxfp4_experts_and_equals_transformers(mxfp4_file):
    path, model = mxfp4_file
    loaded = _load(path, "fp32")
    assert loaded.model.config.model_type == "gpt_oss"
    expert = loaded.model.layers[0].mlp.experts[0]
    rows, width = 2 * model.config.intermediate_size, model.config.hidden_size
    assert expert.gate_up.nbytes == rows * width // 32 * 17 + rows * 4  # the blocks as the file has them, fp32 bias
    torch.testing.assert_close(_stepwise_logits(loaded.backend), _reference(model), atol=1e-4, rtol=1e-4)


def test_the_estimate_of_a_gguf_file_holds_every_other_layer_as_its_window(mxfp4_file):
    """The memory the load dialog counts for a long context: the windowed layers' windows, as transformers places
    them (from the first layer on), not the whole context in every layer."""
    path, model = mxfp4_file
    source = inspect_model(path)
    assert tuple(source.config["layer_windows"]) == layer_windows(model.config)
    assert layer_windows(model.config)[:2] == (WINDOW, None)
    shape, long = model.config, 4096
    per_position = 2 * shape.num_key_value_heads * shape.head_dim * 2
    full = sum(window is None for window in layer_windows(model.config))
    windowed = shape.num_hidden_layers - full
    assert estimate_kv_bytes(source.config, long, 2) == per_position * (full * long + windowed * (WINDOW + KV_POOL_TOKENS))


def test_a_file_of_q4_0_experts_equals_transformers_too(tmp_path: Path):
    """transformers' own GGUF reader fails on such a file; Hearth reads it as it reads Qwen-MoE's 4-bit experts."""
    model = tiny_gpt_oss(window=WINDOW)
    loaded = _load(write_gpt_oss_gguf(tmp_path / "gpt-oss-q4_0.gguf", model, Q.Q4_0), "fp32")
    torch.testing.assert_close(_stepwise_logits(loaded.backend), _reference(model), atol=1e-4, rtol=1e-4)


def test_fp16_layers_beside_mxfp4_experts_pick_transformers_greedy_tokens(mxfp4_file):
    """``auto``'s CPU plan: the attention in fp16 (fp32 sums), the experts still in their blocks."""
    path, model = mxfp4_file
    loaded = _load(path, "fp16")
    assert loaded.model.layers[0].qkv.fmt == "fp16"
    got, expected = _stepwise_logits(loaded.backend), _reference(model)
    assert (got.argmax(dim=1) == expected.argmax(dim=1)).float().mean() >= 0.9
    # the experts round their activations to int8 as llama.cpp does (a prompt's rows to one code a value)
    assert torch.nn.functional.cosine_similarity(got, expected, dim=1).min() > 0.998


def test_an_int8_copy_of_q8_0_attention_decodes_as_its_fp16_layers_do(tmp_path: Path):
    """A file of Q8_0 attention (llama.cpp's MXFP4_MOE type, ggml-org's gpt-oss): ``auto``'s CPU plan keeps its
    blocks as they are for decode steps, where Hearth's kernels run. This tiny random model's routers turn small
    differences into other experts (the experts' int8 activations alone take its logits' least cosine to
    transformers' from 0.9997 to 0.968), so the bound is loose; the copy's logits against fp16's reach 0.995."""
    path = write_gpt_oss_gguf(tmp_path / "gpt-oss-q8_0.gguf", tiny_gpt_oss(window=WINDOW), attention_type=Q.Q8_0)
    copied = _load(path, "fp16", eight_bit_source=True)
    if not copied.model.formats.host.native_kernels:
        pytest.skip("Hearth's kernels are off here: no int8 copy")
    assert copied.model.formats.decode_copy == "int8"
    got, fp16 = _stepwise_logits(copied.backend), _stepwise_logits(_load(path, "fp16").backend)
    assert (got.argmax(dim=1) == fp16.argmax(dim=1)).float().mean() >= 0.9
    assert torch.nn.functional.cosine_similarity(got, fp16, dim=1).min() > 0.993


def test_batched_greedy_equals_each_sequence_alone(folder):
    """Four sequences joining at different steps, their prompts and replies past the window: the batch mixes
    prompt chunks with decode rows, and each window group lets go of its blocks as the sequences grow."""
    backend = _load(folder[0], "fp32").backend
    requests = {f"r{i}": (PROMPT[i : 5 + 5 * i], 12, 2 * i) for i in range(4)}
    replies, released = serve_greedy(backend, requests, 120, 4)
    assert released > 0
    for request_id, (prompt, count, _) in requests.items():
        assert replies[request_id] == greedy_tokens(backend, prompt, count), request_id


def test_the_estimate_counts_the_mxfp4_experts_as_the_load_holds_them(mxfp4_file):
    path, _ = mxfp4_file
    source = inspect_model(path)
    held = _load(path, "fp32").model.weight_bytes
    assert source.kept_expert_bytes is not None
    assert abs(estimate(source, "fp32", 512, "cpu").weight_bytes - held) < 0.05 * held
    plan = formats_for_source(source, "cpu", "auto")
    assert "MXFP4 experts as stored" in plan.label  # what the window shows
    assert "the experts in the file's MXFP4 blocks" in cpu_formats_notice(source, plan, 512, 16 << 30)
    found = inspect_for_dialog(str(path), LoadOptions(device="cpu"), "r", lambda _: 16 << 30, cuda_available=False)
    assert found.expert_format == "MXFP4"  # the load dialog's weights row says so


def test_fp32_from_an_mxfp4_checkpoint_keeps_its_blocks_and_equals_transformers_reading_it(tmp_path: Path):
    """openai's own folder layout (``save_mxfp4_folder``): transformers dequantizes its blocks at load; Hearth keeps
    them and answers as transformers' model does, and the estimate counts them as held."""
    from transformers import GptOssForCausalLM

    tokenizer = byte_tokenizer()
    path = save_mxfp4_folder(tmp_path, tiny_gpt_oss(window=WINDOW, vocab=len(tokenizer)))
    tokenizer.save_pretrained(path)
    reference = GptOssForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    loaded = _load(path, "fp32")
    expert = loaded.model.layers[0].mlp.experts[0]
    rows, width = 2 * reference.config.intermediate_size, reference.config.hidden_size
    assert expert.gate_up.nbytes == rows * width // 32 * 17 + rows * 4
    torch.testing.assert_close(_stepwise_logits(loaded.backend), _reference(reference), atol=1e-4, rtol=1e-4)
    held = loaded.model.weight_bytes
    assert abs(estimate(inspect_model(path), "fp32", 512, "cpu").weight_bytes - held) < 0.05 * held


@pytest.mark.parametrize("budget", [attention.SCORES_AT_ONCE, 4 * 4 * 40])
def test_attention_with_sinks_equals_transformers_eager_attention(budget: int, monkeypatch: pytest.MonkeyPatch):
    """A chunk of 24 queries over 40 keys (16 held before it), 4 heads over 2 kv heads, whole or 4 rows at a time."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    monkeypatch.setattr(attention, "SCORES_AT_ONCE", budget)
    generator = torch.Generator().manual_seed(0)
    q, keys, values = (torch.randn(shape, generator=generator) for shape in ((24, 4, 8), (2, 40, 8), (2, 40, 8)))
    sinks = torch.randn(4, generator=generator)
    mask = attention.causal_mask(16, 24, torch.float32, CPU)  # [24, 40]
    module = SimpleNamespace(num_key_value_groups=2, sinks=sinks, training=False)
    expected, _ = eager_attention_forward(module, q.transpose(0, 1)[None], keys[None], values[None], mask, 1.0)
    torch.testing.assert_close(attention.attend(q, keys, values, mask, sinks=sinks), expected[0])  # [S, H, hd]
