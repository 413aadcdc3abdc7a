"""The context a load takes: what fits up to 32 768 tokens of a Llama 3.1 file stating 131 072, or the one asked
for; and the KV pool sized from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.forward.llama_forward import pool_dtype
from engine.forward.paged_kv import INT8_ROWS, PagedKV
from engine.host import memory
from engine.host.memory import kv_pool_budget
from engine.models.context_choice import choose_load, kv_budget_bytes
from engine.models.format_plan import formats_for_source
from engine.models.inspection import inspect_for_dialog
from engine.models.memory_estimate import NotEnoughMemoryError, estimate_formats
from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError
from engine.protocol.messages import LoadOptions, ModelInspected
from engine.service.batch_runner import BLOCK_SIZE, pool_blocks
from tests.engine.models.random_gguf import Shape, write_hollow_gguf, write_random_gguf

GIB = 1024**3
TRAINED = 131_072
LLAMA31_8B = Shape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, extra_vocab=128_000, context=TRAINED)
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # the CPU fast path keeps keys and values in bf16: 128 KiB a token


@pytest.fixture(scope="module")
def llama31_8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_K_M file in Llama 3.1 8B's shape (8.03 B parameters) stating 131 072 tokens; its data a hole."""
    return write_hollow_gguf(tmp_path_factory.mktemp("llama31") / "Llama-3.1-8B-Q4_K_M.gguf", LLAMA31_8B)


def _inspect(path: Path, free_bytes: int, context: int | None = None) -> ModelInspected:
    options = LoadOptions(device="cpu", context_length=context)
    return inspect_for_dialog(str(path), options, "r", lambda _device: free_bytes, cuda_available=False)


def _chosen(found: ModelInspected):
    return next(item for item in found.estimates if item.precision == found.auto_precision)


def test_a_131k_file_opens_on_24_gib_with_32k_tokens_and_says_why(llama31_8b: Path):
    found = _inspect(llama31_8b, 24 * GIB)

    assert found.n_params > 8_000_000_000
    assert (found.native_context_length, found.context_length) == (TRAINED, 32_768)
    assert found.auto_precision == "int4"
    assert _chosen(found).verdict == "fits"
    assert _chosen(found).kv_bytes == 32_768 * KV_PER_TOKEN  # 4 GiB, where 131 072 tokens would take 16
    assert found.context_reason.startswith("32 768 of 131 072 tokens: the default for chat")


def test_on_8_gib_it_opens_with_what_fits_comfortably(llama31_8b: Path):
    found = _inspect(llama31_8b, 8 * GIB)

    assert 2_048 <= found.context_length < 32_768 and found.context_length % 1_024 == 0
    assert _chosen(found).verdict == "fits"
    assert _chosen(found).total_bytes + 1_024 * KV_PER_TOKEN * 1.05 > 0.85 * 8 * GIB, "the longest that fits"
    assert found.context_reason == f"{found.context_length:,} of 131,072 tokens: what fits in 8.00 GiB free".replace(
        ",", " ")
    assert _inspect(llama31_8b, 16 * GIB).context_length == 32_768, "bf16 keys and values: the default cap on 16"


def test_a_model_is_refused_only_when_2048_tokens_do_not_fit_beside_its_weights(llama31_8b: Path):
    source = inspect_model(llama31_8b)

    precision, context = choose_load(source, "cpu", "auto", None, 6 * GIB)
    assert (precision, context.tokens) == ("int4", 2_048)
    with pytest.raises(NotEnoughMemoryError, match=r"GiB weights \+ 0.25 GiB KV cache for 2048 tokens"):
        choose_load(source, "cpu", "auto", None, 5 * GIB)
    assert _inspect(llama31_8b, 5 * GIB).auto_precision is None


def test_a_context_asked_for_is_taken_and_checked(llama31_8b: Path):
    source = inspect_model(llama31_8b)

    assert choose_load(source, "cpu", "auto", 65_536, 64 * GIB)[1].tokens == 65_536  # past the default cap
    assert _inspect(llama31_8b, 24 * GIB, context=8_192).context_length == 8_192
    with pytest.raises(ModelFileError, match="trained for 131 072 tokens"):
        choose_load(source, "cpu", "auto", TRAINED + 1, 64 * GIB)
    with pytest.raises(NotEnoughMemoryError, match=r"16.00 GiB KV cache for 131072 tokens.*only 20.00 GiB is free"):
        choose_load(source, "cpu", "auto", TRAINED, 20 * GIB)


def _pool(formats, blocks: int) -> PagedKV:
    """The block pool a load in ``formats`` makes for Llama 3.1 8B's shape (its pages taken only when written)."""
    return PagedKV(32, 8, 128, blocks, BLOCK_SIZE, pool_dtype(formats.kv_cache, 128), torch.device("cpu"))


def test_the_kv_pool_holds_the_chosen_context_and_the_estimate_counts_it(llama31_8b: Path, monkeypatch):
    source = inspect_model(llama31_8b)
    precision, context = choose_load(source, "cpu", "auto", None, 8 * GIB)
    formats = formats_for_source(source, "cpu", precision)
    one_block = _pool(formats, 1).bytes_per_block

    monkeypatch.setattr(memory, "device_memory", lambda _device: (0, 64 * 2**20, 64 * 2**20))  # no spare memory
    budget = kv_pool_budget("cpu", kv_budget_bytes(source, formats, context.tokens))

    assert budget == _chosen(_inspect(llama31_8b, 8 * GIB)).kv_bytes
    assert pool_blocks(budget, one_block, context.tokens, max_running=4) * BLOCK_SIZE == context.tokens
    assert kv_pool_budget("cpu", kv_budget_bytes(source, formats, 4_096)) == 4_096 * KV_PER_TOKEN
    odd = kv_pool_budget("cpu", kv_budget_bytes(source, formats, 4_001))
    assert pool_blocks(odd, one_block, 4_001, max_running=4) * BLOCK_SIZE >= 4_001, "a whole context's blocks"


@pytest.mark.parametrize(("kv_cache", "dtype"), [("auto", torch.bfloat16), ("int8", INT8_ROWS)])
@pytest.mark.parametrize("tokens", [4_001, 32_768])
def test_the_estimates_kv_bytes_are_the_pool_buffers_bytes(llama31_8b: Path, monkeypatch, tokens: int, kv_cache: str,
                                                           dtype: torch.dtype):
    """What the estimate counts for a context is what the pool made for it holds, in the plan's bf16, or int8 rows
    with their scales (128 codes and 4 fp16 scales a head's row: 136 bytes where bf16 takes 256)."""
    source = inspect_model(llama31_8b)
    formats = formats_for_source(source, "cpu", "int4", kv_cache=kv_cache)
    monkeypatch.setattr(memory, "device_memory", lambda _device: (0, 0, 0))  # no spare memory
    budget = kv_pool_budget("cpu", kv_budget_bytes(source, formats, tokens))
    pool = _pool(formats, pool_blocks(budget, _pool(formats, 1).bytes_per_block, tokens, max_running=16))

    assert pool.buffer.dtype == dtype
    assert pool.buffer.nbytes == estimate_formats(source, formats, tokens).kv_bytes
    per_token = KV_PER_TOKEN * (136 / 256 if kv_cache == "int8" else 1)
    assert pool.buffer.nbytes == -(-tokens // 256) * 256 * per_token  # the estimate's whole multiples of 256


def test_an_int8_kv_cache_fits_about_twice_the_context(llama31_8b: Path):
    """On 7 GiB free the 4-bit weights leave room for a few thousand tokens of bf16 cache; int8 rows, at 136 bytes
    to bf16's 256, fit nearly twice as many (whole steps of 1 024 tokens)."""
    bf16 = _inspect(llama31_8b, 7 * GIB)
    int8 = inspect_for_dialog(str(llama31_8b), LoadOptions(device="cpu", kv_cache="int8"), "r", lambda _device: 7 * GIB,
                              cuda_available=False)

    assert 2_048 < bf16.context_length < 16_384
    assert 1.7 * bf16.context_length <= int8.context_length <= 2 * bf16.context_length + 1_024
    assert _chosen(int8).kv_bytes == int8.context_length * KV_PER_TOKEN * 136 // 256


def test_a_loaded_131k_file_takes_32k_tokens_and_a_pool_budget_for_them(tmp_path: Path, monkeypatch):
    from engine.models import memory_estimate, model_open

    path = write_random_gguf(tmp_path / "tiny-131k.gguf", shape=Shape(context=TRAINED))
    monkeypatch.setattr(memory_estimate, "available_memory", lambda _device: 24 * GIB)
    per_token = 2 * 2 * 2 * 64 * 2  # 2 layers × 2 KV heads × head size 64, bf16

    def open_with(context: int | None):
        return model_open.open_model(str(path), LoadOptions(device="cpu", context_length=context), lambda _e: None,
                                     lambda *_: None, lambda: False)

    loaded = open_with(None)
    assert (loaded.context_length, loaded.kv_budget_bytes) == (32_768, 32_768 * per_token)
    assert "Context: 32 768 of 131 072 tokens: the default for chat" in " ".join(loaded.notices)
    asked = open_with(4_000)
    assert (asked.context_length, asked.kv_budget_bytes) == (4_000, 4_096 * per_token), "whole blocks"


def test_spare_memory_lets_the_pool_cache_more_than_the_context(monkeypatch):
    """Beside the planned context the pool takes a quarter of the memory free after the weights, however much that
    is, so several conversations share it and their prefixes stay cached; never less than the plan."""
    monkeypatch.setattr(memory, "device_memory", lambda _device: (0, 2 * GIB, 4 * GIB))
    assert kv_pool_budget("cpu", 100 * 2**20) == GIB // 2
    assert kv_pool_budget("cpu", GIB) == GIB
    monkeypatch.setattr(memory, "device_memory", lambda _device: (0, 64 * GIB, 96 * GIB))
    assert kv_pool_budget("cpu", 100 * 2**20) == 16 * GIB
