"""The CPU block pool keeps keys and values in bf16: Hearth's kernels and PyTorch's ops read it alike, and the built-in
model's next tokens over a long prompt stay those of an fp32 cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.chat.chat_template import ChatTemplate, find_folder_template
from engine.forward.native import build
from engine.forward.paged_kv import BatchRow
from engine.models.format_plan import FormatPlan
from engine.models.loading import LoadedModel, LoadPlan, load_model
from engine.models.model_open import open_model
from engine.protocol.messages import LoadOptions
from tests.engine.forward.batch_of_one import OneSequence

REPO = Path(__file__).resolve().parents[3]
BLOCK = 4
PROMPT_TOKENS, STEPS = 1_024, 16
DECISIVE_LEAD = 0.5  # logits between fp32's first and second choice


def _steps(backend) -> list[torch.Tensor]:
    """Three sequences in scattered blocks, one reusing another's prefix (two runs), fed a prompt chunk each, then
    two decode steps together: the logits of every step, [B, V] each."""
    kv = backend.new_pool(64, BLOCK)
    prompts = [[5 + i for i in range(n)] for n in (3, 9, 14)]
    tables = [[7, 2, 30, 31], [0, 1, 22, 40], [10, 11, 12, 13]]
    logits = [backend.forward_batch([BatchRow(p, 0, t) for p, t in zip(prompts, tables)], kv)]
    shared = [0, 1, 50, 51]  # positions 0-7 in the second sequence's blocks, then its own
    logits.append(backend.forward_batch([BatchRow(prompts[1][8:] + [60, 61], 8, shared)], kv))
    for step in range(2):
        rows = [BatchRow([70 + step], len(p) + step, t) for p, t in zip(prompts, tables)]
        logits.append(backend.forward_batch(rows + [BatchRow([80 + step], 11 + step, shared)], kv))
    return logits


def test_pytorchs_ops_read_the_bf16_pool_as_the_kernels_do(tiny_model_dir: Path, monkeypatch):
    """Without Hearth's kernels (a CPU without AVX-512) the pool is bf16 too, and SDPA, the two bmm of a decode row
    over one or two runs and the cache write widen and round it as the kernels do."""
    if build.library() is None:
        pytest.skip("no AVX-512 VNNI/VBMI or no C compiler here: PyTorch's ops are the only path")
    source, origin = find_folder_template(tiny_model_dir)
    plan = LoadPlan(tiny_model_dir, "tiny", torch.device("cpu"), "fp16", 1024, ChatTemplate(source, origin))
    kernels_on = load_model(plan, lambda done, total: None, lambda: False)
    with_kernels = _steps(kernels_on.backend)
    monkeypatch.setattr(build, "kernels", lambda: build.NativeKernels(None, off_reason="off for this test"))
    without = load_model(plan, lambda done, total: None, lambda: False)  # the same, with the kernels off
    assert kernels_on.backend.new_pool(1, BLOCK).buffer.dtype == without.backend.new_pool(1, BLOCK).buffer.dtype == \
        torch.bfloat16
    for kernels, torch_ops in zip(with_kernels, _steps(without.backend)):
        torch.testing.assert_close(torch_ops, kernels, atol=1e-4, rtol=1e-4)


def _open(path: Path) -> LoadedModel:
    """The built-in model with fp16 prompts (and its int4 decode copy): the int4 prompt kernel's activation codes would
    add their own rounding to the cache's."""
    return open_model(str(path), LoadOptions("cpu", "fp16"), lambda _: None, lambda *_: None, lambda: False)


def _teacher_forced(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Logits after a prompt of ``PROMPT_TOKENS`` of ``ids`` and after each of the next ``STEPS - 1``, fed one decode
    step at a time: [STEPS, V]."""
    sequence = OneSequence(loaded.backend, len(ids))
    logits = [sequence.feed(ids[:PROMPT_TOKENS])]
    logits += [sequence.feed([token]) for token in ids[PROMPT_TOKENS : PROMPT_TOKENS + STEPS - 1]]
    return torch.stack(logits)


def test_the_built_in_models_next_tokens_after_a_long_prompt_are_fp32_caches(default_model_path, monkeypatch,
                                                                             record_property):
    """Over 1 024 tokens of text and 16 decode steps after them: measured max |diff| 0.20 of logits up to 37, mean
    0.016, and one near-tie of 64 positions flipped (98.4 %) after 1 536 tokens."""
    bf16 = _open(default_model_path)
    text = (REPO / "README.md").read_text() + (REPO / "docs" / "architecture.md").read_text()
    ids = bf16.tokenize(text)[: PROMPT_TOKENS + STEPS]
    assert len(ids) == PROMPT_TOKENS + STEPS
    got = _teacher_forced(bf16, ids)  # [STEPS, V]
    monkeypatch.setattr(FormatPlan, "kv_cache", property(lambda plan: plan.compute))  # as before: fp32
    fp32 = _open(default_model_path)
    assert fp32.backend.new_pool(1, BLOCK).buffer.dtype == torch.float32
    expected = _teacher_forced(fp32, ids)

    difference = (got - expected).abs()
    same = got.argmax(-1) == expected.argmax(-1)  # [STEPS]
    ranked = expected.topk(2, dim=-1).values  # [STEPS, 2]
    decisive = ranked[:, 0] - ranked[:, 1] >= DECISIVE_LEAD
    record_property("bf16_kv", {"max_abs": difference.max().item(), "mean_abs": difference.mean().item(),
                                "top1": same.float().mean().item()})
    assert difference.max() < 0.5 and difference.mean() < 0.05
    assert same[decisive].all() and same.float().mean() >= 0.9
