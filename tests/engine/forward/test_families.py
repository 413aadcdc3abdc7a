"""Gemma 2, Gemma 3, Phi-3/4 and Granite run on the fast path with transformers' own logits.

Tiny random models of each family's real config (a few small layers), saved as Hugging Face
folders and written as GGUF files in llama.cpp's converter's layout
(``tests.engine.models.random_gguf.write_converted_gguf``): Hearth's fp32 logits from either
equal transformers' forward within rounding. Prompts stay shorter than the sliding windows, so
the results do not depend on them (``windows.layer_windows`` restricts the attention beyond).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.chat.chat_template import ChatTemplate
from engine.forward.weights.packed_sizes import OUTPUT_ROWS
from engine.models.loading import LoadPlan, load_model
from engine.models.model_open import open_model
from engine.protocol.messages import LoadOptions
from engine.models.random_models import byte_tokenizer
from tests.engine.forward.batch_of_one import greedy_tokens, prompt_logits
from tests.engine.models.random_gguf import byte_tokens, write_converted_gguf

CPU = torch.device("cpu")
VOCAB = len(byte_tokens()) + 2  # the converted files' tokenizer (``random_gguf``)
PROMPT = [5, 77, 140, 3, 200, 18, 96, 41, 250, 9, 33, 120]


def gemma3_model(query_pre_attn_scalar: int = 32, vocab: int = VOCAB):
    """Gemma 3 1B's shape in small: head size apart from hidden / heads, five sliding layers to a full one (the
    pattern llama.cpp assumes), the full layers' rope linearly scaled (as the 4B and larger are), q/k norms."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=query_pre_attn_scalar, sliding_window=64, max_position_embeddings=512,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        tie_word_embeddings=True,
    )
    return _randomised(Gemma3ForCausalLM(config), 0.0)


def gemma2_model():
    """Gemma 2's shape in small, its soft caps low enough to bite on random weights."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=64, max_position_embeddings=512,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.0, tie_word_embeddings=True,
    )
    return _randomised(Gemma2ForCausalLM(config), 0.0)


def phi3_model():
    """Phi-4-mini's shape in small: partial rotary, LongRoPE's short and long factors, tied embeddings."""
    from transformers import Phi3Config, Phi3ForCausalLM

    rotary_pairs = 12  # 0.75 of a 32-wide head
    generator = torch.Generator().manual_seed(1)
    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "original_max_position_embeddings": 64,
                         "short_factor": (1 + torch.rand(rotary_pairs, generator=generator)).tolist(),
                         "long_factor": (1 + 4 * torch.rand(rotary_pairs, generator=generator)).tolist()},
        tie_word_embeddings=True, sliding_window=None, pad_token_id=0,
    )
    return _randomised(Phi3ForCausalLM(config), 1.0)


def granite_model():
    """Granite 3.1 2B's multipliers on a small Llama shape (grouped queries, untied output layer)."""
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.015625 * 4, logits_scaling=8.0, tie_word_embeddings=False,
    )
    return _randomised(GraniteForCausalLM(config), 1.0)


FAMILIES = {"gemma3": gemma3_model, "gemma2": gemma2_model, "phi3": phi3_model, "granite": granite_model}


def _randomised(model, norm_centre: float):
    """Norm weights around ``norm_centre`` (Gemma's zero: it multiplies by 1 + w; Phi's one), other weights
    larger than the default initialisation so that every step of the family moves the logits."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            spread, centre = (0.3, norm_centre) if name.endswith("norm.weight") else (0.15, 0.0)
            param.copy_(centre + spread * torch.randn(param.shape, generator=generator))
    return model.eval()


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]  # [V]


def _load(path: Path, context: int = 64):
    """The model at ``path`` in fp32 for ``context`` tokens (within Phi's 64 trained positions: its short factors)."""
    plan = LoadPlan(path, path.stem, CPU, "fp32", context, ChatTemplate(None, "test"))
    return load_model(plan, lambda *_: None, lambda: False)


def _folder(model, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


def _assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_runs_on_the_fast_path_with_transformers_logits(tmp_path: Path, family: str):
    model = FAMILIES[family]()
    loaded = _load(_folder(model, tmp_path / family))
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    _assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT))
    expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert greedy_tokens(loaded.backend, PROMPT, 8) == expected[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_converted_gguf_runs_on_the_fast_path_with_transformers_logits(tmp_path: Path, family: str):
    model = FAMILIES[family]()
    loaded = _load(write_converted_gguf(tmp_path / f"{family}.gguf", model))
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    _assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT))


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_longrope_takes_its_long_factors_where_the_context_chosen_is_past_the_trained_one(tmp_path: Path,
                                                                                            source: str):
    model = phi3_model()
    path = _folder(model, tmp_path / "phi") if source == "folder" else write_converted_gguf(tmp_path / "phi.gguf",
                                                                                          model)
    long_prompt = (PROMPT * 8)[:80]  # past the 64 trained positions: transformers turns to the long factors
    long_context = _load(path, context=256)
    _assert_close(prompt_logits(long_context.backend, long_prompt), _hf_logits(model, long_prompt))
    short_context = _load(path, context=64)
    _assert_close(prompt_logits(short_context.backend, PROMPT), _hf_logits(model, PROMPT))
    assert not torch.allclose(prompt_logits(long_context.backend, PROMPT), _hf_logits(model, PROMPT), atol=1e-3)


def test_a_converted_gemma_file_is_planned_for_the_fast_path_with_its_own_head_size_and_windows(tmp_path: Path):
    """The estimate of a Gemma 3 file counts its head size, and its sliding layers as their windows, as the
    model's config does: five layers of six hold 64 positions (and a pool's spare blocks) of a long context."""
    from engine.forward.windows import layer_windows
    from engine.models.format_plan import formats_for_source
    from engine.models.memory_estimate import KV_POOL_TOKENS, estimate_kv_bytes
    from engine.models.model_files import inspect_model

    model = gemma3_model()  # heads of 32 dimensions in a width of 64 over 4 heads
    source = inspect_model(write_converted_gguf(tmp_path / "gemma3.gguf", model))
    assert formats_for_source(source, "cpu", "fp32").fast_path
    config = model.config
    assert tuple(source.config["layer_windows"]) == layer_windows(config) == (64,) * 5 + (None,)
    per_position = 2 * config.num_key_value_heads * 32 * 2
    assert estimate_kv_bytes(source.config, 100, 2) == config.num_hidden_layers * per_position * 100
    long = 8192
    assert estimate_kv_bytes(source.config, long, 2) == per_position * (long + 5 * (64 + KV_POOL_TOKENS))
    assert estimate_kv_bytes(config.to_dict(), long, 2) == estimate_kv_bytes(source.config, long, 2)


def _as_transformers_4_saved_it(folder: Path) -> Path:
    """``folder`` with its config's ``tie_word_embeddings`` left out, as transformers 4 saved a flag equal to its
    config class's default (Gemma 3's files on the Hub have none)."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    del config["tie_word_embeddings"]
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_a_gemma_folder_silent_on_its_tie_looks_its_tokens_up_in_the_output_layer(tmp_path: Path):
    """Gemma's configs tie the output layer to the token table unless they say otherwise: a 4-bit load on the CPU
    of such a folder (bf16, as the Hub's: its output layer packed from 16-bit rows a chunk at a time) looks tokens
    up in the int8 output layer's rows, as for a tied GGUF file, rather than holding the table a second time, and
    answers as transformers does."""
    model = gemma3_model(vocab=320).to(torch.bfloat16)  # whole blocks of the int8 kernel's 64 rows
    folder = _as_transformers_4_saved_it(_folder(model, tmp_path / "gemma3"))
    model = model.float()
    loaded = open_model(str(folder), LoadOptions("cpu", "int4"), lambda _: None, lambda *_: None, lambda: False)
    if loaded.formats.output_layer != "int8":
        pytest.skip("no int8 output layer here: Hearth's int8 kernel does not run on this CPU")
    assert loaded.formats.token_table == OUTPUT_ROWS
    got, expected = prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT)
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.95


def test_a_tied_folder_that_also_holds_an_output_layer_ties_it_as_transformers_does(tmp_path: Path):
    """A tied checkpoint that keeps a copy of its table as ``lm_head.weight`` (here a different one, to tell them
    apart) loads with the table as its output layer, as transformers ties them."""
    from safetensors.torch import load_file, save_file

    model = gemma3_model()
    folder = _folder(model, tmp_path / "gemma3")
    weights_path = folder / "model.safetensors"
    weights = load_file(str(weights_path))
    weights["lm_head.weight"] = torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, str(weights_path), metadata={"format": "pt"})
    _assert_close(prompt_logits(_load(folder).backend, PROMPT), _hf_logits(model, PROMPT))


def test_gemma_3s_attention_scale_comes_from_query_pre_attn_scalar(tmp_path: Path):
    model = gemma3_model(query_pre_attn_scalar=24)  # as Gemma 3 27B's (hidden / heads), not its head size
    loaded = _load(_folder(model, tmp_path / "gemma3"))
    _assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT))


@pytest.mark.parametrize("family", ["phi3"])
def test_the_gpu_backends_bucket_steps_decode_as_transformers_does(family: str):
    """The GPU backend's steps run eagerly on the CPU: its decode steps (``cuda_batch``) take each family's steps
    as the CPU path does. Gemma's window layers keep its files off the GPU's fast path (``loading.fast_path_applies``)."""
    from engine.forward.cuda_backend import CudaLlama, CudaLlamaBackend
    from tests.engine.forward.formats import fast_plan

    model = FAMILIES[family]()
    fast = CudaLlama(model.config, model.state_dict(), fast_plan(model.config, "fp32", CPU), CPU, 64)
    expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert greedy_tokens(CudaLlamaBackend(fast, 64, use_graphs=False), PROMPT, 8) == expected[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("config, reason", [
    ({"model_type": "phi3", "sliding_window": 262144, "max_position_embeddings": 131072,  # Phi-4-mini's
      "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, None),
    ({"model_type": "phi3", "sliding_window": 2047, "max_position_embeddings": 4096}, None),  # Phi-3-mini-4k's
    ({"model_type": "gemma3_text", "sliding_window": 512, "max_position_embeddings": 32768,
      "hidden_activation": "gelu_pytorch_tanh",
      "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                          "sliding_attention": {"rope_type": "default"}}}, None),
    ({"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
      "rope_parameters": {"full_attention": {"rope_type": "dynamic"}, "sliding_attention": {"rope_type": "default"}}},
     "rope scaling 'dynamic'"),
    ({"model_type": "gemma2", "hidden_activation": "relu"}, "activation 'relu'"),
])
def test_which_configs_the_fast_path_takes(config: dict, reason: str | None):
    """Windows are ``windows.layer_windows``' to apply in every family; a rope type or activation the fast path
    lacks refuses it."""
    from engine.forward.fast_scope import config_view, unsupported_reason

    assert unsupported_reason(config_view(config)) == reason


@pytest.mark.parametrize("family", FAMILIES)
def test_a_converted_file_in_4bit_groups_stays_close_to_transformers(tmp_path: Path, family: str):
    """Every matrix quantized to 4-bit groups (Phi-3's fused q/k/v split by rows of its groups). These random
    weights are larger than a trained model's, so the groups' rounding shows more than in ``test_gguf_direct``:
    its cosine is about 0.96-0.98 here, where a wrong row order or norm would leave little of it."""
    model = FAMILIES[family]()
    path = write_converted_gguf(tmp_path / f"{family}.gguf", model)
    plan = LoadPlan(path, path.stem, CPU, "int4", 64, ChatTemplate(None, "test"))
    loaded = load_model(plan, lambda *_: None, lambda: False)
    assert loaded.precision == "int4"
    got, expected = prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT)
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.95
