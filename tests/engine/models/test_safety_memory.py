"""Memory arithmetic against known model shapes, and the precision chosen for "auto"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.forward.native.support import may_run
from engine.models import memory_estimate
from engine.models.format_plan import formats_for_source
from engine.models.memory_estimate import (
    NotEnoughMemoryError,
    available_memory,
    choose_precision,
    estimate,
    estimate_kv_bytes,
    estimate_weight_bytes,
    fit_verdict,
    params_from_config,
)
from engine.models.model_source import ModelSource

GIB = 1024**3
LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
}


def llama3_source() -> ModelSource:
    return ModelSource(
        kind="hf_folder", path=Path("/models/llama3"), name="Llama-3-8B", config=LLAMA3_8B,
        weight_files=(), total_weight_bytes=0, n_params=params_from_config(LLAMA3_8B),
    )


def test_llama3_8b_parameter_count() -> None:
    assert params_from_config(LLAMA3_8B) == 8_030_261_248


def test_llama3_8b_kv_cache_at_8k_bf16_is_one_gib() -> None:
    assert estimate_kv_bytes(LLAMA3_8B, 8192, 2) == GIB


def test_kv_cache_from_gguf_metadata() -> None:
    smollm2 = {"block_count": 30, "embedding_length": 576, "head_count": 9, "head_count_kv": 3}
    assert estimate_kv_bytes(smollm2, 8192, 2) == 2 * 30 * 3 * 64 * 8192 * 2


def test_weight_bytes_per_precision() -> None:
    assert estimate_weight_bytes(1000, "fp32") == 4000
    assert estimate_weight_bytes(1000, "bf16") == 2000
    assert estimate_weight_bytes(1000, "int8") == 1000
    assert estimate_weight_bytes(1000, "int8", unquantized_params=100) == 900 + 200
    assert estimate_weight_bytes(1024, "nf4") == 576  # bitsandbytes' NF4: an fp32 scale per 64
    with pytest.raises(ValueError, match="unknown format 'fp8'"):
        estimate_weight_bytes(1000, "fp8")


def test_estimate_adds_weights_kv_and_overhead() -> None:
    found = estimate(llama3_source(), "bf16", 8192, "cuda")
    assert found.weight_bytes == 2 * 8_030_261_248
    assert found.kv_bytes == GIB
    assert found.total_bytes == found.weight_bytes + found.kv_bytes + found.overhead_bytes
    quantized = estimate(llama3_source(), "int4", 8192, "cuda")
    assert 5 * GIB < quantized.weight_bytes < 6 * GIB  # 16-bit embeddings and head included


def test_fit_verdict_thresholds() -> None:
    assert fit_verdict(85, 100) == "fits"
    assert fit_verdict(86, 100) == "tight"
    assert fit_verdict(100, 100) == "tight"
    assert fit_verdict(101, 100) == "won't fit"


def test_cpu_prefers_fp32_then_bf16_then_4bit_for_a_model_transformers_runs() -> None:
    gpt2_like = {**LLAMA3_8B, "model_type": "gpt2"}
    source = ModelSource(kind="hf_folder", path=Path("/models/gpt2-like"), name="gpt2-like", config=gpt2_like,
                         weight_files=(), total_weight_bytes=0, n_params=params_from_config(gpt2_like))
    assert choose_precision(source, "cpu", 8192, available_bytes=64 * GIB) == "fp32"
    assert choose_precision(source, "cpu", 8192, available_bytes=24 * GIB) == "bf16"
    assert choose_precision(source, "cpu", 8192, available_bytes=10 * GIB) == "int4"


def test_a_llama_folder_on_the_cpu_fast_path_takes_fp16_then_4bit_counted_as_fast_llama_holds_them(
        host_features) -> None:
    source = llama3_source()
    table = 128256 * 4096
    layers = source.n_params - 2 * table
    assert estimate(source, "fp16", 8192, "cpu").weight_bytes == 2 * layers + 2 * 2 * table
    four_bit = 0.5 + 4 / 32  # bytes a weight in 4-bit groups of 32 with a bf16 scale and zero point (PyTorch's)
    on_kernels = 0.5 + (2 + 4 / 8) / 32  # Hearth's kernels': two int8 codes a group, two bf16 factors per 8 groups
    host_features(native_kernels=True)  # the output layer on Hearth's int8 kernel
    int8_head = 128256 * (4096 + 4096 // 32 * 2)  # a byte a weight, an fp16 scale per 32
    table_in_two_planes = 2 * table * four_bit
    assert estimate(source, "int4", 8192, "cpu").weight_bytes == int(on_kernels * layers + table_in_two_planes
                                                                     + int8_head)
    host_features(native_kernels=False)  # no kernels built: PyTorch's pairs, the head in two planes
    assert estimate(source, "int4", 8192, "cpu").weight_bytes == int(four_bit * layers + 2 * table_in_two_planes)
    assert choose_precision(source, "cpu", 8192, available_bytes=64 * GIB) == "fp16"
    assert choose_precision(source, "cpu", 8192, available_bytes=10 * GIB) == "int4"


def test_cuda_prefers_bf16_then_int8_then_int4() -> None:
    source = llama3_source()
    assert choose_precision(source, "cuda", 8192, available_bytes=80 * GIB) == "bf16"
    assert choose_precision(source, "cuda", 8192, available_bytes=14 * GIB) == "int8"
    assert choose_precision(source, "cuda", 8192, available_bytes=8 * GIB) == "int4"


def test_tight_fit_is_used_when_nothing_fits_comfortably() -> None:
    needed = estimate(llama3_source(), "int4", 8192, "cuda").total_bytes
    assert choose_precision(llama3_source(), "cuda", 8192, available_bytes=int(needed * 1.05)) == "int4"


def test_nothing_fits_gives_the_estimate() -> None:
    with pytest.raises(NotEnoughMemoryError) as caught:
        choose_precision(llama3_source(), "cuda", 8192, available_bytes=2 * GIB)
    message = str(caught.value)
    assert "Llama-3-8B needs about" in message and "at int4" in message
    assert "1.00 GiB KV cache for 8192 tokens" in message and "2.00 GiB is free" in message


def test_available_memory() -> None:
    assert available_memory("cpu") > 0
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        available_memory("tpu")


TABLE = 49152 * 576  # the built-in model's token table, tied to its output layer


def test_real_default_model_fits_on_cpu(default_model_path: Path, without_prompt_kernels: None) -> None:
    from engine.models.model_files import inspect_model

    source = inspect_model(default_model_path)
    found = estimate(source, "fp32", 8192, "cpu")
    # the output layer in fp32 apart from the token table, which stays in the file's Q8_0 blocks
    assert source.kept_table_bytes == TABLE // 32 * 34
    assert found.weight_bytes == 4 * (source.n_params - TABLE) + 4 * TABLE + source.kept_table_bytes
    assert found.kv_bytes == 2 * 30 * 3 * 64 * 8192 * 4  # fp32 weights, the reference precision, keep fp32 keys
    assert choose_precision(source, "cpu", 8192, available_bytes=8 * GIB) == "fp16"


def test_fp16_on_the_cpu_counts_the_4bit_decode_copy_of_a_4bit_file(default_model_path: Path) -> None:
    from engine.models.model_files import inspect_model

    source = inspect_model(default_model_path)  # Q4_1 layers, a Q8_0 token table
    layer_params = source.n_params - TABLE
    on_cpu, on_gpu = estimate(source, "fp16", 2048, "cpu"), estimate(source, "fp16", 2048, "cuda")
    assert source.four_bit_layers
    assert on_gpu.weight_bytes == 2 * layer_params + 2 * 2 * TABLE
    # Beside the 4-bit copy, gate/up's 3072 rows of width 576 keep their last 64 columns in fp32 after FBGEMM's fp16
    # blocks in each of 30 layers; q/k/v (960 rows) and out (576) are padded to 1024
    tails, padding = (4 - 2) * 64 * 30 * 3072, 2 * (1024 - 576) * 30 * (960 + 576)
    four_bit = 0.5 + (2 + 4 / 8) / 32 if may_run() else 0.5 + 4 / 32  # Hearth's kernels' int4 scales, or bf16 pairs
    layers = 2 * layer_params + int(layer_params * four_bit) + tails + padding
    # the output layer in int8 groups of 32 on Hearth's kernel (an fp16 scale each), the tied table looked up in
    # it; else fp16 padded like the layers, beside the token table in the file's Q8_0 blocks
    q8_0_table = TABLE // 32 * 34
    table_and_head = TABLE + TABLE // 32 * 2 if may_run() else 2 * 1024 * 49152 + q8_0_table
    assert on_cpu.weight_bytes == layers + table_and_head
    assert on_cpu.kv_bytes == 2 * 30 * 3 * 64 * 2048 * 2, "the CPU fast path keeps its keys and values in bf16"
    assert on_gpu.kv_bytes == 2 * 30 * 3 * 64 * 2048 * 2


def test_a_4bit_file_runs_4bit_alone_where_the_fp16_copy_would_not_fit_comfortably(default_model_path: Path,
                                                                                    without_prompt_kernels: None) -> None:
    from engine.models.memory_estimate import cpu_formats_notice
    from engine.models.model_files import inspect_model

    source = inspect_model(default_model_path)
    fp16 = estimate(source, "fp16", 8192, "cpu").total_bytes
    four_bit = estimate(source, "int4", 8192, "cpu").total_bytes
    # about a third of fp16 with its decode copy (0.336 beside an int8 output layer, 0.29 beside an fp16 one)
    assert estimate(source, "int4", 8192, "cpu").weight_bytes < 0.35 * estimate(source, "fp16", 8192, "cpu").weight_bytes
    roomy, cramped = int(fp16 / 0.8), int(fp16 / 0.95)  # fp16 "fits", or is only "tight"
    assert choose_precision(source, "cpu", 8192, available_bytes=roomy) == "fp16"
    assert choose_precision(source, "cpu", 8192, available_bytes=cramped) == "int4"
    fp16_plan, int4_plan = formats_for_source(source, "cpu", "fp16"), formats_for_source(source, "cpu", "int4")
    assert "fp16 weights for prompts and an int4 copy" in cpu_formats_notice(source, fp16_plan, 8192, roomy)
    assert "int4 weights alone" in cpu_formats_notice(source, int4_plan, 8192, cramped)
    with pytest.raises(NotEnoughMemoryError, match="even at int4"):
        choose_precision(source, "cpu", 8192, available_bytes=four_bit // 2)


def test_a_gguf_file_transformers_loads_counts_its_fp32_copy() -> None:
    stablelm = ModelSource(  # an architecture Hearth does not read directly
        kind="gguf", path=Path("/models/stablelm.gguf"), name="stablelm", weight_files=(), total_weight_bytes=0,
        config={"architecture": "stablelm", "block_count": 32, "embedding_length": 3072, "head_count": 32,
                "vocab_size": 32064, "tied_embeddings": False}, n_params=3_800_000_000,
    )
    found = estimate(stablelm, "fp32", 4096, "cpu")
    assert found.weight_bytes == 2 * 4 * 3_800_000_000  # the dequantized file, and the model it fills


def test_bf16_on_the_cpu_goes_through_transformers_and_counts_its_fp32_copy(default_model_path: Path) -> None:
    from engine.models.model_files import inspect_model

    source = inspect_model(default_model_path)
    assert estimate(source, "bf16", 2048, "cpu").weight_bytes == (2 + 4) * source.n_params


def test_gpt2_style_config_names_are_understood() -> None:
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    assert estimate_kv_bytes(gpt2, 1024, 4) == 2 * 12 * 12 * 64 * 1024 * 4


def test_config_without_a_shape_cannot_be_estimated() -> None:
    from engine.models.model_source import ModelFileError

    with pytest.raises(ModelFileError, match="does not give its hidden size"):
        estimate_kv_bytes({"model_type": "mystery"}, 1024, 2)


def _q4_k_m_file(n_params: int, hidden: int) -> ModelSource:
    """A Llama GGUF file of ``n_params`` parameters in Q4_K_M, as its metadata states it."""
    return ModelSource(
        kind="gguf", path=Path("/models/model.gguf"), name="model", weight_files=(), total_weight_bytes=0,
        config={"architecture": "llama", "block_count": 24, "embedding_length": hidden, "head_count": 32,
                "head_count_kv": 32, "feed_forward_length": 4 * hidden, "vocab_size": 49152,
                "tied_embeddings": True, "file_type": "MOSTLY_Q4_K_M"}, n_params=n_params,
    )


@pytest.mark.parametrize(("fp16_math", "expected"), [(False, "int4"), (True, "fp16")])
def test_a_large_4bit_file_keeps_its_4bit_weights_where_they_run_prompts_faster(host_features, fp16_math, expected):
    """Plenty of memory, no prompt kernel of Hearth's: a 1.7B file runs 4-bit alone on a CPU with int8 dot products
    and no fp16 arithmetic (its prompts faster, a third of the memory), with fp16 arithmetic the fp16 copy; a 135M
    one keeps the copy."""
    from engine.models import memory_estimate

    host_features(int8_dot=True, fp16_math=fp16_math, amx_tiles=False, prompt_kernel=False)
    large, small = _q4_k_m_file(1_700_000_000, 2048), _q4_k_m_file(135_000_000, 576)
    assert choose_precision(large, "cpu", 4096, available_bytes=64 * GIB) == expected
    assert choose_precision(small, "cpu", 4096, available_bytes=64 * GIB) == "fp16"
    notice = memory_estimate.cpu_formats_notice(large, formats_for_source(large, "cpu", expected), 4096, 64 * GIB)
    assert ("no fp16 arithmetic" in notice) == (expected == "int4")


@pytest.mark.parametrize("int8_dot", [True, False])
def test_a_4bit_file_of_any_size_keeps_its_4bit_weights_on_hearths_prompt_kernel(host_features, int8_dot):
    """On AVX-512 or AVX2 (with or without VNNI) Hearth's int4 prompt kernel runs a 4-bit file's prompts faster than
    an fp16 copy does, the 135M one's too: auto keeps the weights alone, and the notice says why."""
    from engine.models import memory_estimate

    host_features(amx_tiles=False, prompt_kernel=True, int8_dot=int8_dot, fp16_math=False, native_kernels=True)
    for n_params, hidden in ((135_000_000, 576), (1_700_000_000, 2048)):
        four_bit = _q4_k_m_file(n_params, hidden)
        assert choose_precision(four_bit, "cpu", 4096, available_bytes=64 * GIB) == "int4"
        plan = formats_for_source(four_bit, "cpu", "int4")
        assert "Hearth's int4 prompt kernel" in memory_estimate.cpu_formats_notice(four_bit, plan, 4096, 64 * GIB)


def test_a_4bit_file_of_any_size_keeps_its_4bit_weights_on_amx_bf16_tiles(host_features):
    """With AMX's bf16 tiles a 4-bit file's prompts run faster from its 4-bit weights than from an fp16 copy
    (``int4_prompts``), the 135M one's too; the notice says why, and a file of fp16 weights still runs fp16."""
    from engine.models import memory_estimate

    host_features(amx_tiles=True, fp16_math=True, native_kernels=True)
    small = _q4_k_m_file(135_000_000, 576)
    assert choose_precision(small, "cpu", 4096, available_bytes=64 * GIB) == "int4"
    notice = memory_estimate.cpu_formats_notice(small, formats_for_source(small, "cpu", "int4"), 4096, 64 * GIB)
    assert "bf16 matrix tiles" in notice
    fp16_file = replace(small, config={**small.config, "file_type": "MOSTLY_F16"})
    assert not fp16_file.four_bit_layers
    assert choose_precision(fp16_file, "cpu", 4096, available_bytes=64 * GIB) == "fp16"
