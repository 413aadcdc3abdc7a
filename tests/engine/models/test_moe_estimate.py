"""A mixture of experts is estimated as the fast path holds it: its experts at their 4-bit size, not as transformers'
fp32 copy of the whole file."""

from __future__ import annotations

from pathlib import Path

from engine.models.format_plan import formats_for_source
from engine.models.memory_estimate import choose_precision, estimate, params_from_config
from engine.models.model_source import ModelSource

GIB = 1024**3
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B's config.json, the sizes that count
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
}
GGUF_METADATA = {  # its Q4_K_M file's ``{arch}.*`` keys as ``gguf_check.gguf_config`` keeps them
    "architecture": "qwen3moe", "block_count": 48, "embedding_length": 2048, "feed_forward_length": 6144,
    "head_count": 32, "head_count_kv": 4, "key_length": 128, "vocab_size": 151936, "tied_embeddings": False,
    "expert_count": 128, "expert_used_count": 8, "expert_feed_forward_length": 768, "file_type": "MOSTLY_Q4_K_M",
}
FILE_BYTES = 18_600_000_000  # about the size of the published Qwen3-30B-A3B-Q4_K_M.gguf (18.6 GB)
Q4_K_TABLE = 151936 * 2048 // 256 * 144


def test_the_30b_a3b_shape_counts_its_30_5_billion_parameters() -> None:
    assert params_from_config(QWEN3_30B_A3B) == params_from_config(GGUF_METADATA) == 30_532_110_336


def test_the_30b_a3b_q4_k_m_file_is_estimated_near_its_size_plus_its_kv_cache() -> None:
    source = ModelSource(kind="gguf", path=Path("/models/qwen3-30b-a3b.gguf"), name="Qwen3-30B-A3B",
                         config=GGUF_METADATA, weight_files=(), total_weight_bytes=FILE_BYTES,
                         n_params=params_from_config(GGUF_METADATA), kept_table_bytes=Q4_K_TABLE)
    for precision in ("int4", "fp16"):  # fp16: the attention in fp16 beside its int4 copy, the experts in int4 alone
        assert formats_for_source(source, "cpu", precision).experts == "int4"
        found = estimate(source, precision, 4096, "cpu")
        assert 0.95 * FILE_BYTES < found.weight_bytes < 1.15 * FILE_BYTES, precision
        assert found.kv_bytes == 2 * 48 * 4 * 128 * 4096 * 2  # bf16 keys and values
    assert choose_precision(source, "cpu", 4096, available_bytes=32 * GIB) in ("int4", "fp16")


def test_a_bf16_folder_at_fp16_holds_its_experts_in_fp16() -> None:
    source = ModelSource(kind="hf_folder", path=Path("/models/qwen3-30b-a3b"), name="Qwen3-30B-A3B",
                         config=QWEN3_30B_A3B, weight_files=(), total_weight_bytes=0,
                         n_params=params_from_config(QWEN3_30B_A3B))
    fp16, int4 = estimate(source, "fp16", 4096, "cpu"), estimate(source, "int4", 4096, "cpu")
    assert fp16.weight_bytes > 2 * 28e9 and int4.weight_bytes < 0.7 * 30.6e9
