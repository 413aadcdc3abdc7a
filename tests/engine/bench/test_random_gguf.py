"""Random-weight GGUF files: llama.cpp's block types per tensor, sane weights, and the built-in model's tokenizer."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import Q4_K, dequantize

from engine.bench import random_gguf
from engine.bench.random_blocks import BLOCK_FIELDS, pack_k4_scales, random_blocks
from engine.bench.random_gguf import SHAPES, RandomGgufError, tensor_specs

Q = GGMLQuantizationType


def _types(specs, role):
    return {spec.name: spec.qtype for spec in specs if spec.name.endswith(f".{role}.weight")}


def test_llama3_8b_q4_k_m_keeps_the_layers_llama_cpp_keeps_in_6_bits():
    specs = tensor_specs(SHAPES["llama3-8b"], "q4_k_m")
    six_bit_layers = sorted(int(name.split(".")[1]) for name, qtype in _types(specs, "ffn_down").items()
                            if qtype == Q.Q6_K)

    assert six_bit_layers == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [n for n, t in _types(specs, "attn_v").items() if t == Q.Q6_K] == [
        f"blk.{i}.attn_v.weight" for i in six_bit_layers]
    assert set(_types(specs, "attn_q").values()) == {Q.Q4_K}
    by_name = {spec.name: spec for spec in specs}
    assert by_name["output.weight"].qtype == Q.Q6_K and by_name["token_embd.weight"].qtype == Q.Q4_K
    assert (by_name["blk.0.ffn_down.weight"].rows, by_name["blk.0.ffn_down.weight"].cols) == (4096, 14336)
    assert (by_name["blk.0.attn_k.weight"].rows, by_name["blk.0.attn_k.weight"].cols) == (1024, 4096)
    assert len(specs) == 2 + 9 * 32 + 1


def test_qwen_shape_has_its_attention_biases():
    names = {spec.name for spec in tensor_specs(SHAPES["qwen2.5-7b"], "q4_0")}

    assert {"blk.27.attn_q.bias", "blk.27.attn_k.bias", "blk.27.attn_v.bias", "output.weight"} <= names


def test_the_qwen3_30b_a3b_cut_stacks_each_layers_experts_as_llama_cpp_does():
    name, ftype = random_gguf.parse("random-gguf:qwen3-30b-a3b@2:q4_k_m")
    specs = {spec.name: spec for spec in tensor_specs(random_gguf.shape_of(name), ftype)}

    assert not any(name.startswith("blk.2.") for name in specs)  # the first two of 48 layers
    gate, down, router = (specs[f"blk.1.{role}.weight"] for role in ("ffn_gate_exps", "ffn_down_exps", "ffn_gate_inp"))
    assert (gate.experts, gate.rows, gate.cols, gate.qtype) == (128, 768, 2048, Q.Q4_K)
    assert (down.experts, down.rows, down.cols) == (128, 2048, 768)
    assert (router.rows, router.cols, router.qtype) == (128, 2048, Q.F32)
    assert specs["blk.1.ffn_down_exps.weight"].qtype == Q.Q6_K  # llama-quantize's ffn_down rule (last layer of 2)
    assert specs["blk.0.attn_q.weight"].rows == 32 * 128 and "blk.0.attn_k_norm.weight" in specs
    assert "blk.0.ffn_gate.weight" not in specs


def test_the_smollm2_135m_q4_1_plan_matches_the_built_in_file(default_model_path):
    """The built-in model is a Q4_1 file llama-quantize wrote: same tensors, block types and shapes."""
    reader = GGUFReader(default_model_path)
    real = {(t.name, t.tensor_type, tuple(int(n) for n in t.shape)) for t in reader.tensors}
    planned = {(s.name, s.qtype, (s.cols,) if s.qtype == Q.F32 else (s.cols, s.rows))
               for s in tensor_specs(SHAPES["smollm2-135m"], "q4_1")}

    assert planned == real


def test_k4_scales_unpack_to_what_was_packed():
    rng = np.random.default_rng(1)
    sc = rng.integers(0, 64, size=(50, 8), dtype=np.uint8)
    mn = rng.integers(0, 64, size=(50, 8), dtype=np.uint8)

    got_sc, got_mn = Q4_K.get_scale_min(pack_k4_scales(sc, mn))

    assert np.array_equal(got_sc.reshape(50, 8), sc) and np.array_equal(got_mn.reshape(50, 8), mn)


@pytest.mark.parametrize("qtype", sorted(BLOCK_FIELDS, key=int))
def test_random_blocks_dequantize_to_small_centred_weights(qtype):
    raw = random_blocks(qtype, 64, 512, 0.02, np.random.default_rng(0))  # [64, bytes]

    weights = dequantize(raw, qtype)

    assert weights.shape == (64, 512) and np.isfinite(weights).all()
    assert 0.015 < weights.std() < 0.025 and abs(weights.mean()) < 0.003  # Q4_0, Q5_0: q - 8 has mean -0.5


def test_a_row_that_blocks_do_not_split_is_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        random_blocks(Q.Q4_K, 2, 576, 0.02, np.random.default_rng(0))


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(RandomGgufError, match="llama3-8b.*q4_k_m"):
        random_gguf.parse("random-gguf:llama3-9b:q4_k_m")


def test_a_written_file_reads_back_with_the_built_in_tokenizer(tmp_path, monkeypatch, default_model_path):
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    path = random_gguf.ensure_random_gguf("random-gguf:smollm2-135m:q4_k_m", default_model_path)

    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    builtin = GGUFReader(default_model_path).fields["tokenizer.ggml.tokens"]
    assert reader.fields["tokenizer.ggml.tokens"].contents() == builtin.contents()
    assert reader.fields["general.architecture"].contents() == "llama"
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type == Q.Q6_K
    weights = dequantize(down.data, down.tensor_type)  # [576, 1536]
    assert weights.shape == (576, 1536) and 0.015 < weights.std() < 0.025
    assert random_gguf.ensure_random_gguf("random-gguf:smollm2-135m:q4_k_m", default_model_path) == path
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no partial file is left behind"


def test_the_built_in_tokens_are_padded_to_the_real_vocabulary_with_unused_ones(default_model_path):
    fields = random_gguf._tokenizer_fields(default_model_path)
    padded = random_gguf.padded_tokens(fields, SHAPES["phi4-mini"].vocab)

    tokens, types = padded["tokenizer.ggml.tokens"][0], padded["tokenizer.ggml.token_type"][0]
    assert len(tokens) == len(types) == 200064
    assert tokens[:49152] == fields["tokenizer.ggml.tokens"][0], "every built-in token keeps its id"
    assert tokens[-1] == "<|unused_200063|>" and set(types[49152:]) == {int(gguf.TokenType.UNUSED)}
    assert padded["tokenizer.ggml.merges"] == fields["tokenizer.ggml.merges"]
    with pytest.raises(ValueError, match="cannot hold"):
        random_gguf.padded_tokens(fields, 1000)


def test_shapes_state_their_real_models_vocabulary():
    specs = {spec.name: spec for spec in tensor_specs(SHAPES["gemma3-4b"], "q4_k_m")}
    assert specs["token_embd.weight"].rows == 262208 and specs["token_embd.weight"].qtype == Q.Q6_K
    assert SHAPES["llama3.1-8b"].vocab == 128256 and SHAPES["smollm2-135m"].vocab == random_gguf.BUILT_IN_VOCAB


def test_gemma3_and_phi4_mini_shapes_hold_their_familys_tensors():
    gemma = {spec.name: spec for spec in tensor_specs(SHAPES["gemma3-1b"], "q4_k_m")}
    phi = {spec.name: spec for spec in tensor_specs(SHAPES["phi4-mini"], "q4_k_m")}

    assert {"blk.25.attn_q_norm.weight", "blk.25.post_attention_norm.weight", "blk.25.post_ffw_norm.weight"} <= set(gemma)
    assert (gemma["blk.0.attn_q.weight"].rows, gemma["blk.0.attn_q.weight"].cols) == (4 * 256, 1152)
    assert gemma["blk.0.attn_q.weight"].qtype == Q.Q5_0  # 1152 weights do not split into 256-weight blocks
    assert (phi["blk.0.attn_qkv.weight"].rows, phi["blk.0.ffn_up.weight"].rows) == ((24 + 16) * 128, 2 * 8192)
    assert phi["blk.0.attn_qkv.weight"].qtype == Q.Q5_K and phi["rope_factors_long.weight"].cols == 48
    assert "blk.0.ffn_gate.weight" not in phi and "output.weight" not in phi


def test_the_gpt_oss_20b_cut_holds_mxfp4_experts_their_biases_and_the_sinks():
    name, ftype = random_gguf.parse("random-gguf:gpt-oss-20b@2:mxfp4_moe")
    specs = {spec.name: spec for spec in tensor_specs(random_gguf.shape_of(name), ftype)}

    assert not any(name.startswith("blk.2.") for name in specs)
    gate, down = specs["blk.1.ffn_gate_exps.weight"], specs["blk.1.ffn_down_exps.weight"]
    assert (gate.experts, gate.rows, gate.cols, gate.qtype) == (32, 2880, 2880, Q.MXFP4)
    assert down.qtype == Q.MXFP4 and specs["blk.1.attn_q.weight"].qtype == Q.Q8_0
    assert (specs["blk.1.ffn_up_exps.bias"].rows, specs["blk.1.ffn_up_exps.bias"].cols) == (32, 2880)
    assert specs["blk.0.attn_sinks.weight"].cols == 64 and "blk.0.attn_output.bias" in specs
    assert "blk.0.post_attention_norm.weight" in specs and "blk.0.ffn_norm.weight" not in specs
