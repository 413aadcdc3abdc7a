"""One forward pass over several sequences in a block-wise cache gives each the logits it would get alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.native import activation_codes
from engine.forward.paged_kv import BatchRow, PagedKV
from engine.host.allocator import return_freed_memory
from tests.engine.forward.batch_of_one import prompt_logits

BLOCK = 4


def test_sequences_of_different_lengths_in_scattered_blocks_match_running_alone(tiny_loaded) -> None:
    backend = tiny_loaded.backend
    assert isinstance(backend, FastLlamaBackend)
    kv = backend.new_pool(64, BLOCK)
    prompts = [[5 + i for i in range(n)] for n in (3, 9, 14)]
    tables = [[7, 2, 30, 31], [0, 1, 2 + 20, 40], [10, 11, 12, 13]]  # scattered, reordered and consecutive
    first = backend.forward_batch([BatchRow(p[:-1], 0, t) for p, t in zip(prompts, tables)], kv)
    assert first.shape[0] == 3
    last = backend.forward_batch([BatchRow(p[-1:], len(p) - 1, t) for p, t in zip(prompts, tables)], kv)
    for index, prompt in enumerate(prompts):
        expected = prompt_logits(backend, prompt)
        torch.testing.assert_close(last[index], expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(first[index], prompt_logits(backend, prompt[:-1]), atol=1e-4, rtol=1e-4)


def test_a_prompt_chunk_after_a_prefix_in_other_blocks_matches_running_alone(tiny_loaded) -> None:
    """The chunk's own blocks follow a prefix held elsewhere (as a reused system prompt is), or the chunk starts in
    the prefix's blocks and goes on in others: either gives the logits of one pass over the whole prompt."""
    backend = tiny_loaded.backend
    kv = backend.new_pool(64, BLOCK)
    prompt = [5 + i for i in range(15)]
    backend.forward_batch([BatchRow(prompt[:8], 0, [20, 21])], kv)
    after_prefix = backend.forward_batch([BatchRow(prompt[8:], 8, [20, 21, 3, 4, 5])], kv)  # 0-7, then 8-14
    torch.testing.assert_close(after_prefix[0], prompt_logits(backend, prompt), atol=1e-4, rtol=1e-4)
    backend.forward_batch([BatchRow(prompt[:6], 0, [30, 31])], kv)
    spanning = backend.forward_batch([BatchRow(prompt[6:], 6, [30, 31, 40, 41])], kv)  # 6-7, then 8-14
    torch.testing.assert_close(spanning[0], prompt_logits(backend, prompt), atol=1e-4, rtol=1e-4)


def test_a_sequence_is_read_from_its_runs_of_blocks_in_place() -> None:
    """A prefix shared with another sequence, then its own blocks: two runs, each read where it lies."""
    kv = PagedKV(2, 1, 4, 16, BLOCK, torch.float32, torch.device("cpu"))
    kv.buffer.copy_(torch.arange(kv.buffer.numel(), dtype=torch.float32).view(kv.buffer.shape))
    layout = kv.layout([BatchRow([1], 17, [5, 6, 7, 2, 3]), BatchRow([1], 6, [9, 10])])
    shared_then_own, alone = (span.runs for span in layout.spans)
    assert shared_then_own == (slice(20, 32), slice(8, 14)) and alone == (slice(36, 43),)
    keys, values = kv.read(1, shared_then_own)  # [Hkv, 18, hd]: the runs one after the other
    assert torch.equal(keys[0], torch.cat([kv.buffer[1, 0, 0, 20:32], kv.buffer[1, 0, 0, 8:14]]))
    (keys_t, run_values), _ = kv.layer_runs(shared_then_own)[1]
    assert keys_t.data_ptr() == kv.buffer[1, 0, 0, 20].data_ptr() and torch.equal(run_values, kv.buffer[1, 1, :, 20:32])


def test_a_copied_block_carries_the_shared_positions(tiny_loaded) -> None:
    backend = tiny_loaded.backend
    kv = backend.new_pool(16, BLOCK)
    prompt = [9, 8, 7, 6, 5, 4]
    backend.forward_batch([BatchRow(prompt, 0, [0, 1])], kv)
    kv.copy_block(1, 5, 1)  # position 4 shared; position 5 differs
    edited = prompt[:5] + [3]
    logits = backend.forward_batch([BatchRow(edited[5:], 5, [0, 5])], kv)[0]
    torch.testing.assert_close(logits, prompt_logits(backend, edited), atol=1e-4, rtol=1e-4)


def test_a_batched_step_rounds_its_layers_to_one_code_and_its_output_layer_to_two(tiny_loaded, monkeypatch) -> None:
    """In a step over several sequences the CPU kernels round a layer's activations to one int8 code a value, as
    llama.cpp does, and the output layer's to two in every step; a lone sequence's step takes two throughout."""
    seen: set[tuple[str, int]] = set()
    for name in ("mlp", "logits"):
        def spy(model, *args, _name=name, _original=getattr(FastLlama, name)):
            seen.add((_name, activation_codes.codes()))
            return _original(model, *args)
        monkeypatch.setattr(FastLlama, name, spy)
    backend = tiny_loaded.backend
    kv = backend.new_pool(16, BLOCK)
    backend.forward_batch([BatchRow([5, 6], 0, [0]), BatchRow([7], 0, [1])], kv)
    assert seen == {("mlp", 1), ("logits", 2)}
    seen.clear()
    backend.forward_batch([BatchRow([8], 2, [0])], kv)
    assert seen == {("mlp", 2), ("logits", 2)}


def _resident_bytes() -> int:
    return_freed_memory()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident size from /proc")
def test_the_kv_pool_holds_only_the_pages_of_blocks_in_use() -> None:
    """The pool is reserved for its whole budget (1 GiB here) but occupies memory only as blocks are written."""
    before = _resident_bytes()
    kv = PagedKV(layers=4, kv_heads=4, head_dim=64, num_blocks=8192, block_size=16, dtype=torch.float32,
                 device=torch.device("cpu"))  # [4, 2, 4, 131072, 64] fp32: 1 GiB
    for layer in range(4):
        kv.write(layer, slice(0, 64), torch.ones(2, 4, 64, 64))  # blocks 0-3 of every layer
    grown = _resident_bytes() - before
    assert kv.buffer.numel() * 4 == 1024**3
    assert grown <= 8 * 1024**2  # 4 blocks × 64 KiB each, and a page of slack per row of the pool
