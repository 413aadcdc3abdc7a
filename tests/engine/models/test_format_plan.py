"""The one place formats are chosen: what each device, precision, file and CPU get, and the names users see."""

from __future__ import annotations

import pytest

from engine.models.format_plan import (
    HostFeatures, ModelTraits, choose_formats, eight_bit_prompts_faster, four_bit_prompts_faster,
)
from engine.protocol.messages import PRECISIONS, canonical_precision

SMOLLM2_135M_Q4 = ModelTraits(fast_path=True, vocab=49152, hidden=576, four_bit_layers=True, kept_table=True,
                              n_params=135_000_000)
LLAMA_FOLDER = ModelTraits(fast_path=True, vocab=128256, hidden=4096, n_params=8_000_000_000)
GPT2_FOLDER = ModelTraits(fast_path=False, vocab=50257, hidden=768)
ZEN4 = HostFeatures(native_kernels=True, amx_tiles=False, int8_dot=True, fp16_math=False, prompt_kernel=True)
ARM_DOTPROD = HostFeatures(native_kernels=True, int8_dot=True)  # NEON: its int4 kernel takes no prompt chunks
SAPPHIRE_RAPIDS = HostFeatures(native_kernels=True, amx_tiles=True, int8_dot=True, fp16_math=True)
PLAIN_X86 = HostFeatures()  # AVX2 alone: no kernels of Hearth's, no int8 dot products


def test_a_4bit_gguf_alone_on_a_cpu_with_amx_prompts_on_the_tiles_and_attends_in_bf16():
    plan = choose_formats("cpu", "int4", SMOLLM2_135M_Q4, SAPPHIRE_RAPIDS)
    assert (plan.fast_path, plan.layers, plan.decode_copy) == (True, "int4", None)
    assert plan.prompt_path == "AMX bf16 tiles" and plan.prompt_attention == "bf16"
    assert (plan.output_layer, plan.token_table, plan.kv_cache) == ("int8", "file", "bf16")


def test_a_4bit_gguf_alone_on_a_cpu_without_amx_prompts_on_hearths_kernel_and_attends_in_fp32():
    plan = choose_formats("cpu", "int4", SMOLLM2_135M_Q4, ZEN4)
    assert plan.prompt_path == "Hearth's int4 kernel" and plan.prompt_attention == "fp32"
    assert choose_formats("cpu", "int4", SMOLLM2_135M_Q4, ARM_DOTPROD).prompt_path == "int8 GEMM"
    assert choose_formats("cpu", "int4", SMOLLM2_135M_Q4, PLAIN_X86).prompt_path == "fp32 matmul"


def test_a_table_tied_to_an_int8_output_layer_is_looked_up_there_and_not_held_twice():
    tied = ModelTraits(fast_path=True, vocab=200064, hidden=3072, four_bit_layers=True, kept_table=True, tied=True)
    untied = ModelTraits(fast_path=True, vocab=128256, hidden=4096, four_bit_layers=True, kept_table=True)
    assert (choose_formats("cpu", "int4", tied, ZEN4).output_layer,
            choose_formats("cpu", "int4", tied, ZEN4).token_table) == ("int8", "output")
    assert choose_formats("cpu", "int4", untied, ZEN4).token_table == "file"
    assert choose_formats("cpu", "int4", tied, PLAIN_X86).token_table == "file", "no int8 kernel: the file's blocks"


def test_without_hearths_kernels_the_output_layer_and_table_go_in_two_int4_planes():
    no_table = ModelTraits(fast_path=True, vocab=49152, hidden=576, four_bit_layers=True)
    plan = choose_formats("cpu", "int4", no_table, PLAIN_X86)
    assert (plan.output_layer, plan.token_table) == ("int4x2", "int4x2")


def test_fp16_of_a_4bit_file_keeps_an_int4_copy_for_decoding_and_says_so():
    plan = choose_formats("cpu", "fp16", SMOLLM2_135M_Q4, ZEN4)
    assert (plan.layers, plan.decode_copy, plan.output_layer) == ("fp16", "int4", "int8")
    assert plan.prompt_path == "FBGEMM fp16"
    assert plan.label == "fp16 weights, int4 copy for decoding"
    assert choose_formats("cpu", "fp16", LLAMA_FOLDER, ZEN4).decode_copy is None  # a file of 16-bit weights


def test_fp16_of_gpt_oss_keeps_its_q8_0_layers_as_an_int8_copy_for_decoding_beside_an_int8_output_layer():
    """The file's own blocks, at about half of fp16's bytes a decode step; not without Hearth's int8 kernel, nor in
    fp32 (exact) or on a GPU."""
    gpt_oss = ModelTraits(fast_path=True, vocab=201088, hidden=2880, kept_table=True, eight_bit_layers=True,
                          mxfp4_experts=True)
    plan = choose_formats("cpu", "fp16", gpt_oss, ZEN4)
    assert (plan.layers, plan.decode_copy, plan.output_layer, plan.experts) == ("fp16", "int8", "int8", "int8")
    assert plan.label == "fp16 weights, MXFP4 experts as stored, int8 copy for decoding"  # not "fp16" experts
    assert choose_formats("cpu", "fp16", gpt_oss, PLAIN_X86).decode_copy is None
    assert choose_formats("cpu", "fp32", gpt_oss, ZEN4).experts == "fp32"
    assert choose_formats("cuda", "bf16", gpt_oss).decode_copy is None


def test_auto_without_a_memory_estimate_takes_fp16_on_the_cpu_fast_path_and_bf16_on_a_gpu():
    assert choose_formats("cpu", "auto", LLAMA_FOLDER, ZEN4).layers == "fp16"
    assert choose_formats("cpu", "auto", GPT2_FOLDER, ZEN4).layers == "fp32"
    assert choose_formats("cuda", "auto", LLAMA_FOLDER).layers == "bf16"


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_the_cpu_fast_path_keeps_keys_and_values_in_bf16_below_fp32_weights(precision):
    """Half fp32's bytes for the same context (llama.cpp keeps fp16); fp32 weights (the reference precision),
    transformers' own cache and a GPU's keep the compute dtype."""
    assert choose_formats("cpu", precision, LLAMA_FOLDER, ZEN4).kv_cache == "bf16"
    assert choose_formats("cpu", precision, LLAMA_FOLDER, PLAIN_X86).kv_cache == "bf16"
    assert choose_formats("cpu", "fp32", LLAMA_FOLDER, ZEN4).kv_cache == "fp32"
    assert choose_formats("cpu", "fp32", GPT2_FOLDER, ZEN4).kv_cache == "fp32"
    assert choose_formats("cuda", "fp16", LLAMA_FOLDER).kv_cache == "fp16"


@pytest.mark.parametrize("precision", ["fp16", "int4", "fp32"])
def test_an_int8_kv_cache_holds_on_the_cpu_fast_path_and_elsewhere_is_ignored_with_a_notice(precision):
    plan = choose_formats("cpu", precision, LLAMA_FOLDER, ZEN4, kv_cache="int8")
    assert plan.kv_cache == "int8" and plan.kv_notice is None
    on_gpu = choose_formats("cuda", "bf16", LLAMA_FOLDER, kv_cache="int8")
    assert on_gpu.kv_cache == "bf16" and "GPU keeps its own" in on_gpu.kv_notice
    through_transformers = choose_formats("cpu", "fp32", GPT2_FOLDER, ZEN4, kv_cache="int8")
    assert through_transformers.kv_cache == "fp32" and "transformers" in through_transformers.kv_notice
    assert choose_formats("cpu", precision, LLAMA_FOLDER, ZEN4, kv_cache="bf16").kv_notice is None
    with pytest.raises(ValueError, match="unknown KV cache"):
        choose_formats("cpu", precision, LLAMA_FOLDER, ZEN4, kv_cache="fp8")


def test_int8_on_cuda_runs_the_fast_path_computing_in_bf16():
    plan = choose_formats("cuda", "int8", LLAMA_FOLDER)
    assert (plan.fast_path, plan.layers, plan.output_layer, plan.compute, plan.kv_cache) == (
        True, "int8", "int8", "bf16", "bf16")
    assert plan.label == "int8 weights"


def test_int4_through_transformers_is_bitsandbytes_nf4_on_a_gpu_and_the_quantized_fallback_on_the_cpu():
    plan = choose_formats("cuda", "int4", GPT2_FOLDER)
    assert (plan.fast_path, plan.precision, plan.layers, plan.compute) == (False, "int4", "nf4", "bf16")
    assert plan.label == "nf4 (bitsandbytes) weights"
    on_cpu = choose_formats("cpu", "int4", GPT2_FOLDER, ZEN4)
    assert (on_cpu.fast_path, on_cpu.layers, on_cpu.token_table, on_cpu.compute) == (False, "int4", "bf16", "fp32")
    assert on_cpu.quantized_fallback and not plan.quantized_fallback
    assert on_cpu.label == "quantized transformers fallback (int4)"


def test_precisions_the_cpu_fast_path_lacks_go_through_transformers():
    assert not choose_formats("cpu", "bf16", LLAMA_FOLDER, ZEN4).fast_path


def test_int8_on_the_cpu_runs_the_fast_path_on_hearths_int8_kernel_prompts_included():
    plan = choose_formats("cpu", "int8", LLAMA_FOLDER, ZEN4)
    assert (plan.fast_path, plan.layers, plan.decode_copy, plan.output_layer) == (True, "int8", None, "int8")
    assert plan.prompt_path == "Hearth's int8 kernel" and plan.label == "int8 weights"
    assert choose_formats("cpu", "int8", LLAMA_FOLDER, PLAIN_X86).prompt_path == "fp32 matmul"
    assert choose_formats("cpu", "int8", GPT2_FOLDER, ZEN4).quantized_fallback  # no fast path: Hearth's int8 under it


@pytest.mark.parametrize("host, faster", [(ZEN4, True), (SAPPHIRE_RAPIDS, False), (ARM_DOTPROD, False),
                                          (PLAIN_X86, False)])
def test_a_q8_0_file_runs_its_int8_blocks_alone_where_hearths_prompt_kernels_run(host: HostFeatures, faster: bool):
    """Where Hearth's prompt kernels run (``prompt_kernel``: the x86 variants; AMX hosts report it too when their
    variant has it), a Q8_0 file's prompts run faster from its int8 blocks than from an fp16 copy."""
    q8_0 = ModelTraits(fast_path=True, vocab=49152, hidden=2048, eight_bit_layers=True, n_params=1_700_000_000)
    assert eight_bit_prompts_faster(q8_0, host) == faster
    assert not eight_bit_prompts_faster(LLAMA_FOLDER, ZEN4)  # a file of 16-bit weights


def test_nf4_from_an_earlier_version_means_int4():
    assert canonical_precision("nf4") == "int4"
    assert "nf4" not in PRECISIONS
    assert choose_formats("cpu", "nf4", SMOLLM2_135M_Q4, ZEN4).layers == "int4"
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        choose_formats("cpu", "fp8", SMOLLM2_135M_Q4, ZEN4)


def test_the_note_says_why_auto_chose_and_shows_in_the_label():
    plan = choose_formats("cpu", "int4", SMOLLM2_135M_Q4, ZEN4, note="fp16 did not fit")
    assert plan.label == "int4 weights (fp16 did not fit)"


AVX2_LAPTOP = HostFeatures(native_kernels=True, prompt_kernel=True)  # Hearth's avx2 variant: no int8 dot products


@pytest.mark.parametrize(("host", "n_params", "faster"), [
    (SAPPHIRE_RAPIDS, 135_000_000, True), (ZEN4, 135_000_000, True), (AVX2_LAPTOP, 135_000_000, True),
    (ARM_DOTPROD, 135_000_000, False), (ARM_DOTPROD, 1_700_000_000, True), (PLAIN_X86, 1_700_000_000, False),
    (HostFeatures(native_kernels=True, int8_dot=True, fp16_math=True), 1_700_000_000, False),
])
def test_4bit_prompts_run_faster_from_the_int4_weights_on_hearths_kernels_or_large_models_with_int8_dots(
        host, n_params, faster):
    traits = ModelTraits(fast_path=True, vocab=49152, hidden=2048, four_bit_layers=True, n_params=n_params)
    assert four_bit_prompts_faster(traits, host) is faster
    assert not four_bit_prompts_faster(LLAMA_FOLDER, SAPPHIRE_RAPIDS)  # not a 4-bit file


@pytest.mark.parametrize(("config", "tied"), [
    ({"model_type": "gemma3_text"}, True),  # Gemma 3's files on the Hub: the flag left out at its default
    ({"model_type": "gemma2", "tie_word_embeddings": False}, False),
    ({"model_type": "llama"}, False),
    ({"model_type": "llama", "tie_word_embeddings": True}, True),  # SmolLM2, Llama 3.2 1B
    ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}, True),
    ({"model_type": "llava", "tie_word_embeddings": False, "text_config": {"tie_word_embeddings": True}}, False),
    ({"model_type": "llava", "text_config": {"model_type": "qwen2", "tie_word_embeddings": True}}, True),
])
def test_a_folders_tie_is_read_as_transformers_reads_it(config: dict, tied: bool):
    """The plan (``ties_embeddings``) and the estimate read one answer: the config's own flag, a multimodal text
    config's after it, else the default of the model type's config class."""
    from engine.forward.family import ties_embeddings
    from engine.models.memory_estimate import model_shape

    shape = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    full = {**config, **shape} if "text_config" not in config else {
        **config, "text_config": {**config["text_config"], **shape}}
    assert ties_embeddings(full) == model_shape(full).tied_embeddings == tied


@pytest.mark.parametrize("tied", [True, False])
def test_a_gguf_files_tie_is_its_lack_of_an_output_layer_to_the_plan_and_the_estimate_alike(tied: bool):
    from engine.forward.family import ties_embeddings
    from engine.models.memory_estimate import model_shape

    checked = {"block_count": 2, "embedding_length": 64, "head_count": 4, "model_type": "gemma3_text",
               "tied_embeddings": tied}  # ``gguf_check``'s: its own answer, whatever the type's default
    assert ties_embeddings(checked) == model_shape(checked).tied_embeddings == tied
