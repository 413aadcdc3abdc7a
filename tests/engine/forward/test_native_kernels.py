"""Hearth's C kernels give what PyTorch's ops give, in every variant this CPU runs (``kernel_variant``): 4-bit and 8-bit
matmuls of a few rows, decode rows' and short prompt chunks' attention over a block pool, RMSNorm; where they cannot
be built the callers keep PyTorch's ops."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.forward.attention import attend, attend_runs, causal_mask
from engine.forward.llama_forward import rotate_pairs_
from engine.forward.native import activation_codes, build, int4_scales, rotary, support, variants
from engine.forward.native import decode_attention as native_attention
from engine.forward.native import int4_matmul as native_int4
from engine.forward.native import int8_matmul as native_int8
from engine.forward.native.decode_attention import ChunkRuns, DecodeRuns
from engine.forward.native.int4_matmul import Int4Matmul
from engine.forward.native.int8_matmul import Int8Matmul
from engine.forward.family import Clamp
from engine.forward.mlp import clamped_swiglu
from engine.forward.native.norm import rms_norm, swiglu
from engine.forward.native.scratch import Scratch
from engine.forward.weights.quant_int import dequantize_int4, int4_groups_of, pack_quantized
from engine.forward.weights.row_chunks import RowChunks
from engine.forward.windows import window_start

REPO = Path(__file__).resolve().parents[3]
needs_kernels = pytest.mark.usefixtures("kernel_variant")  # once with each variant this CPU runs
needs_amx = pytest.mark.skipif(not native_int4.runs_on_amx(), reason="no AMX bf16 tiles (or no kernels) here")


def _dequantized(groups) -> torch.Tensor:
    """The weight the packed groups stand for once their scales and zeros are the kernels' (``int4_scales``):
    [N, K] fp32."""
    laid_out = int4_scales.block_scales(groups.scales_and_zeros)
    return dequantize_int4(groups.q, int4_scales.scales_and_zeros_of(laid_out, groups.shape[1] // groups.group),
                           groups.group)


def _rounded_to_8_bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` [M, K] as the kernels take rows of a batch: each group of 32 in int8 codes under its largest magnitude
    over 127 (llama.cpp's Q8_0)."""
    grouped = x.unflatten(1, (-1, 32))  # [M, G, 32]
    scales = grouped.abs().amax(-1, keepdim=True) / 127
    return (torch.round(grouped / scales) * scales).flatten(1)


def _multiplied_as_in_a_step(multiply, x: torch.Tensor, weight: torch.Tensor, sequences: int) -> None:
    """``multiply(x)`` in a step over ``sequences`` sequences. One sequence's rows take two codes a value, about 15
    bits: within 1e-4 of the exact product. A batched step's take one: exactly the product of the 8-bit rows (to
    fp32's rounding of the sums)."""
    with activation_codes.for_step(sequences):
        got = multiply(x)  # [M, N]
    exact = x @ weight.t()
    scale = exact.abs().max()
    if sequences == 1:
        assert ((got - exact).abs().max() / scale).item() < 1e-4
    else:
        assert ((got - _rounded_to_8_bits(x) @ weight.t()).abs().max() / scale).item() < 2e-6
        assert ((got - exact).abs().max() / scale).item() < 1e-2


@needs_kernels
@pytest.mark.parametrize("sequences", [1, 8])
@pytest.mark.parametrize("length", [1, 2, 3, 16, 17, 23])
def test_int4_rows_are_their_rounded_codes_times_the_dequantized_weight(length, sequences):
    """From 16 rows on the avx512 variant takes strips of 32 weight rows, several activation rows a pass (17, 23:
    a last pass of fewer)."""
    torch.manual_seed(length)
    groups = int4_groups_of(torch.randn(192, 160) * 0.05)  # 3 blocks of 64 rows, 5 groups of 32
    multiply = Int4Matmul(groups.cpu_packed(2), groups.scales_and_zeros, 32)
    multiply.on_amx = False  # the int4 kernel's own rows, even where AMX would take 16
    x = torch.randn(length, 160) * torch.logspace(-2, 1, 160)  # groups of very different sizes
    _multiplied_as_in_a_step(multiply, x, _dequantized(groups), sequences)


@needs_kernels
@pytest.mark.parametrize("length", [activation_codes.MANY_ROWS, activation_codes.MANY_ROWS + 5])
def test_a_prompt_chunks_rows_take_one_code_a_value_in_any_step(length):
    """From ``MANY_ROWS`` rows a call's activations take one int8 code a value (llama.cpp's Q8_0), a sequence's own
    rows too: exactly the product of the 8-bit rows (here 133 rows: a last pass of one row)."""
    torch.manual_seed(length)
    groups = int4_groups_of(torch.randn(192, 160) * 0.05)
    multiply = Int4Matmul(groups.cpu_packed(2), groups.scales_and_zeros, 32)
    multiply.on_amx = False
    x = torch.randn(length, 160) * torch.logspace(-2, 1, 160)
    _multiplied_as_in_a_step(multiply, x, _dequantized(groups), sequences=8)
    with activation_codes.for_step(1):
        one_sequence = multiply(x)
    with activation_codes.for_step(8):
        assert torch.equal(one_sequence, multiply(x))


@needs_kernels
@pytest.mark.parametrize("length", [24, 45])
def test_a_prompts_rows_give_the_same_floats_however_the_kernel_tiles_them(length):
    """A call of many rows (the avx2 variants transpose them eight to a vector, in tiles of 24 over 1 024 columns
    at a time) gives each row what a call of two rows gives it, over more columns than a tile covers at once."""
    torch.manual_seed(length)
    groups = int4_groups_of(torch.randn(128, 2144) * 0.05)  # 67 groups of 32
    multiply = Int4Matmul(groups.cpu_packed(2), groups.scales_and_zeros, 32)
    multiply.on_amx = False
    x = torch.randn(length, 2144) * torch.logspace(-2, 1, 2144)
    with activation_codes.for_step(8):
        _multiplied_as_in_a_step(multiply, x, _dequantized(groups), sequences=8)
        assert torch.equal(multiply(x), torch.cat([multiply(x[m : m + 2]) for m in range(0, length, 2)]))


@needs_amx
@pytest.mark.parametrize("length", [native_int4.AMX_ROWS, 40, 77])
def test_int4_rows_on_amx_tiles_are_their_bf16_rounding_times_each_weight_rounded_once(length):
    """From ``AMX_ROWS`` rows on, a call multiplies on AMX's tiles: the activations rounded to bf16 times each
    weight rounded once to bf16, summed in fp32 (rows past a tile's 16 and a pass's 32 included); fewer rows keep
    the int4 kernel."""
    torch.manual_seed(length)
    groups = int4_groups_of(torch.randn(192, 320) * 0.05)  # 6 strips of 32 weight rows, 10 groups
    multiply = Int4Matmul(groups.cpu_packed(2), groups.scales_and_zeros, 32)
    x = torch.randn(length, 320) * torch.logspace(-2, 1, 320)
    weight = _dequantized(groups)
    rounded = x.bfloat16().double() @ weight.bfloat16().double().t()
    got = multiply(x)
    assert multiply.on_amx and ((got - rounded).abs().max() / rounded.abs().max()).item() < 1e-5
    exact = x @ weight.t()
    assert ((got - exact).norm() / exact.norm()).item() < 1e-2
    fewer = x[: native_int4.AMX_ROWS - 1]
    assert not torch.allclose(multiply(fewer).double(), rounded[: len(fewer)], rtol=0, atol=1e-6 * rounded.abs().max())


@needs_amx
@pytest.mark.parametrize("length", [17, 40])
def test_a_weight_wider_than_one_pass_of_the_tiles_sums_its_passes_exactly(length):
    """An 8B model's down projection (14 336 columns) takes the tiles in passes of at most 8 192 columns, each
    adding to the sums the last left in fp32: the same bf16 products as one pass (rows past a tile's 16 included)."""
    torch.manual_seed(length)
    groups = int4_groups_of(torch.randn(64, 10_240) * 0.05)
    multiply = Int4Matmul(groups.cpu_packed(2), groups.scales_and_zeros, 32)
    x = torch.randn(length, 10_240)
    rounded = x.bfloat16().double() @ _dequantized(groups).bfloat16().double().t()
    got = multiply(x)
    assert multiply.on_amx and ((got - rounded).abs().max() / rounded.abs().max()).item() < 1e-5


@needs_kernels
def test_int4_layers_take_the_kernel_for_a_few_rows_and_agree_with_pytorchs():
    torch.manual_seed(0)
    groups = int4_groups_of(torch.randn(128, 96) * 0.05)
    run, _ = pack_quantized(groups, None, "int4")
    x = torch.randn(4, 96)
    weight = _dequantized(groups)
    theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), groups.cpu_packed(2), 32,
                                                        groups.scales_and_zeros.bfloat16()).float()
    with activation_codes.for_step(4):
        batched = run(x)  # [M, N]
    exact, ours = x @ weight.t(), run(x)
    assert (ours - exact).abs().max() < (theirs - exact).abs().max() / 10  # about 15 bits where theirs takes bf16
    assert torch.allclose(batched, _rounded_to_8_bits(x) @ weight.t(), atol=1e-5)  # 8 bits a group in a batch


@needs_kernels
@pytest.mark.parametrize("sequences", [1, 8])
@pytest.mark.parametrize("length", [1, 2, 3, 16])
def test_int8_rows_match_the_dequantized_weight(length, sequences):
    torch.manual_seed(length)
    weight = torch.randn(192, 160) * 0.05  # 3 blocks of 64 rows, 5 groups of 32
    codes, scales = native_int8.quantize(weight)
    dequantized = (codes.float().unflatten(1, (-1, 32)) * scales.float().unsqueeze(-1)).flatten(1)  # [N, K]
    assert (dequantized - weight).abs().max() <= scales.float().max() / 2 + 1e-6  # within half a step
    x = torch.randn(length, 160) * torch.logspace(-2, 1, 160)  # groups of very different sizes
    _multiplied_as_in_a_step(Int8Matmul(weight), x, dequantized, sequences)


@needs_kernels
def test_an_int8_weight_laid_out_a_chunk_of_rows_at_a_time_is_the_whole_weights_layout(monkeypatch):
    """A large output layer is quantized a few thousand rows at a time (its fp32 temporaries a chunk's size), from
    a tensor or from blocks decoded a chunk at a time: the same bytes and products as at once, a short last chunk
    included."""
    torch.manual_seed(0)
    weight, x = torch.randn(64 * 5, 96), torch.randn(3, 96)
    whole = Int8Matmul(weight)
    monkeypatch.setattr(native_int8, "CHUNK_ROWS", 128)  # chunks of 2, 2 and 1 blocks
    chunked = Int8Matmul(weight)
    assert torch.equal(chunked(x), whole(x))
    asked: list[tuple[int, int]] = []

    def decode(start: int, end: int) -> torch.Tensor:  # a GGUF table's blocks, decoded where packed
        asked.append((start, end))
        return weight[start:end].clone()

    from_blocks = Int8Matmul(RowChunks(*weight.shape, decode))
    assert torch.equal(from_blocks(x), whole(x)) and asked == [(0, 128), (128, 256), (256, 320)]


def test_a_q8_0_blocks_codes_and_scale_come_back_exactly():
    """A GGUF file's Q8_0 table (the built-in model's) read as fp32, ``d * q``, quantizes back to its own blocks."""
    torch.manual_seed(0)
    scales = (torch.rand(64, 3) * 0.01 + 1e-3).half()  # [N, G]: fp16, as a Q8_0 block keeps its d
    codes = torch.randint(-127, 128, (64, 3, 32), dtype=torch.int8)
    codes[:, :, 0] = 127  # llama.cpp's scale maps each block's largest magnitude to 127
    weight = (codes.float() * scales.float().unsqueeze(-1)).flatten(1)  # [N, 96]
    got_codes, got_scales = native_int8.quantize(weight)
    assert torch.equal(got_scales, scales) and torch.equal(got_codes, codes.flatten(1))


@needs_kernels
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(6, 2, 32), (28, 4, 128)])  # 28/4/128: Qwen2.5-7B's
@pytest.mark.parametrize("with_sinks", [False, True])  # gpt-oss's: a logit per query head beside the positions
def test_decode_attention_matches_pytorchs_over_runs_of_the_bf16_pool(heads, kv_heads, head_dim, with_sinks):
    torch.manual_seed(0)
    positions = 512
    layer = torch.randn(2, kv_heads, positions, head_dim).bfloat16()  # [2, Hkv, P, hd]: as the pool holds them
    runs = [(slice(0, 1),), (slice(64, 64 + 130),), (slice(300, 364), slice(400, 411))]  # one, past a tile, two runs
    q = torch.randn(len(runs) + 1, heads, head_dim) * 0.3  # the last row: a prompt chunk's, not attended here
    out = torch.full_like(q, 7.0)
    sinks = torch.randn(heads) * 2 if with_sinks else None
    DecodeRuns.of(list(range(len(runs))), runs).attend(q, out, layer, sinks)
    for row, row_runs in enumerate(runs):
        views = tuple((layer[0, :, r].float().transpose(1, 2), layer[1, :, r].float()) for r in row_runs)
        expected = attend_runs(q[row].view(kv_heads, -1, head_dim), views, torch.empty(kv_heads, heads // kv_heads,
                                                                                       head_dim), sinks=sinks)
        assert torch.allclose(out[row], expected.view(heads, head_dim), atol=1e-5)
    assert torch.equal(out[-1], torch.full_like(out[-1], 7.0))


@needs_kernels
def test_the_attention_kernels_refuse_a_pool_they_would_misread():
    q = torch.randn(1, 6, 32)
    with pytest.raises(ValueError, match="bf16"):
        DecodeRuns.of([0], [(slice(0, 4),)]).attend(q, torch.empty_like(q), torch.randn(2, 2, 8, 32))


@pytest.mark.parametrize(("turned_off", "reason"), [("cpu", "lacks AVX2"), ("variable", "HEARTH_KERNELS=none")])
def test_without_the_kernels_the_callers_keep_pytorchs_ops(monkeypatch, turned_off, reason):
    if turned_off == "cpu":
        monkeypatch.setattr(support, "has_flags", lambda flags: False)  # a CPU without the instructions
    else:
        monkeypatch.setenv(support.CHOICE_VARIABLE, "none")
    build.kernels.cache_clear()
    try:
        assert build.library() is None and build.kernels_variant("cpu") == "none"
        assert reason in build.kernel_notices()[0] and "off" in build.kernel_notices()[0]
        assert not native_int4.covers(128, 96, 32) and not native_attention.covers(6, 2, 32, torch.float32)
        groups = int4_groups_of(torch.randn(128, 96) * 0.05)
        run, _ = pack_quantized(groups, None, "int4")
        x = torch.randn(2, 96)
        assert torch.allclose(run(x), x @ _dequantized(groups).t(), atol=1e-2)
    finally:
        build.kernels.cache_clear()  # built again, where it may, once the CPU's flags are restored


def test_a_failed_build_is_recorded_and_not_retried_until_the_source_changes(monkeypatch, tmp_path):
    """Where the package holds no library (a source checkout), a compiler that fails costs one attempt, not one at
    every start: later starts read its message from the cache and say why the kernels are off, until the source (or
    the compiler) changes."""
    attempts = tmp_path / "attempts"
    failing = tmp_path / "cc"
    failing.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho x >> {attempts}\n"
                       "echo 'cc: error: no such thing' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    monkeypatch.setattr(support, "has_flags", lambda flags: True)  # whatever the CPU
    monkeypatch.setenv(support.CHOICE_VARIABLE, variants.VARIANTS[0].name)
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    sources = _sources_alone(tmp_path)
    monkeypatch.setattr(variants, "HERE", sources)

    def started() -> build.NativeKernels:
        build.kernels.cache_clear()  # a new process
        return build.kernels()

    try:
        first, second = started(), started()
        assert first.library is None and second.library is None and build.kernels_variant("cpu") == "none"
        assert attempts.read_text().count("x") == 1
        assert "cc: error: no such thing" in first.off_reason and "recorded" in second.off_reason
        assert "no such thing" in build.kernel_notices()[0]
        edited = sources / variants.VARIANTS[0].source
        edited.write_text(edited.read_text() + "\n// edited\n")
        assert started().library is None and attempts.read_text().count("x") == 2
    finally:
        build.kernels.cache_clear()


def test_where_the_best_variant_cannot_be_built_the_next_one_runs(monkeypatch, tmp_path):
    runnable = support.candidates()[0]
    if len(runnable) < 2:
        pytest.skip("this CPU runs one variant at most")
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    sources = _sources_alone(tmp_path)
    monkeypatch.setattr(variants, "HERE", sources)
    (sources / runnable[0].source).write_text("#error this compiler cannot\n")
    build.kernels.cache_clear()
    try:
        assert build.kernels_variant("cpu") == runnable[1].name
        assert build.kernel_notices() == (f"Hearth's CPU kernels run their {runnable[1].name} variant.",)
    finally:
        build.kernels.cache_clear()


@needs_kernels
@pytest.mark.parametrize("length", [1, 8, 80])  # 80: the rows spread over the threads
def test_rms_norm_matches_pytorchs(length):
    x = torch.randn(length, 576) * 3
    assert torch.allclose(rms_norm(x, 1e-5), torch.nn.functional.rms_norm(x, (576,), eps=1e-5), atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("length", [1, 20])  # 20: the rows spread over the threads
def test_rotating_and_storing_new_rows_is_pytorchs_rotation_and_bf16_cache_write(length):
    torch.manual_seed(length)
    heads, kv_heads, head_dim = 6, 2, 64
    qkv = torch.randn(length, heads + 2 * kv_heads, head_dim)  # [S, H + 2Hkv, hd]
    angles = torch.rand(length, 1, head_dim // 2) * 6.3
    turns = torch.polar(torch.full_like(angles, 0.9), angles)  # [S, 1, hd/2]: scaled, as a rope factor leaves them
    qkv[0, -1, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38])  # ties to even, overflow
    layer = torch.randn(2, kv_heads, 128, head_dim).bfloat16()  # [2, Hkv, P, hd]: the pool's
    slots = torch.randperm(128)[:length]  # [S]: a batched step's rows land in their own sequences' blocks
    expected_qkv, expected_layer = qkv.clone(), layer.clone()
    rotate_pairs_(expected_qkv[:, : heads + kv_heads], turns)
    expected_layer[:, :, slots] = expected_qkv[:, heads:].transpose(0, 1).unflatten(0, (2, kv_heads)).bfloat16()
    rotary.rotate_and_store(qkv, turns, layer, slots, heads)
    assert torch.allclose(qkv[:, :heads], expected_qkv[:, :heads], atol=1e-6)  # the queries, in place
    assert torch.equal(layer[1], expected_layer[1])  # the values rounded to nearest even, as PyTorch rounds
    keys, expected_keys = layer[0].float(), expected_layer[0].float()  # the rotation's last bit may round either way
    assert torch.allclose(keys, expected_keys, rtol=2**-8, atol=0) and (keys != expected_keys).float().mean() < 0.01


@needs_kernels
@pytest.mark.parametrize("length", [1, 20])
def test_swiglu_matches_pytorchs_over_the_whole_range(length):
    torch.manual_seed(length)
    gate_up = torch.randn(length, 2 * 1536) * 6
    gate_up[0, :4] = torch.tensor([-100.0, -20.0, 20.0, 100.0])  # far into both tails of the sigmoid
    expected = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]  # [M, F]
    got = swiglu(gate_up)
    assert got.is_contiguous() and torch.allclose(got, expected, rtol=2e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("length", [1, 20])
def test_gpt_oss_clamped_gate_matches_pytorchs_ops(length):
    """Gates above the limit and ups beyond it on either side are clamped; a NaN stays a NaN."""
    torch.manual_seed(length)
    clamp = Clamp(alpha=1.702, limit=7.0)  # gpt-oss's
    gate_up = torch.randn(length, 2 * 1536) * 6
    gate_up[0, :4] = torch.tensor([-100.0, -20.0, 20.0, 100.0])
    gate_up[0, 1536:1540] = torch.tensor([-100.0, -7.5, 7.5, 100.0])
    gate_up[-1, 8] = float("nan")
    expected = clamped_swiglu(gate_up.clone(), clamp)
    got = swiglu(gate_up, clamp)
    assert torch.allclose(got, expected, rtol=2e-6, atol=1e-5, equal_nan=True) and got[-1, 8].isnan()


@needs_kernels
@pytest.mark.parametrize(("start", "length", "heads", "kv_heads", "head_dim"), [
    (0, 5, 9, 3, 64), (40, 33, 9, 3, 64), (250, 128, 9, 3, 64),  # 250 + 128: past the first run
    (250, 19, 28, 4, 128), (0, 40, 32, 32, 64),  # Qwen2.5-7B's heads (7 a kv head), SmolLM2-1.7B's (one)
])
def test_chunk_attention_matches_sdpa_with_itscausal_mask(start, length, heads, kv_heads, head_dim):
    _chunk_attended_as_sdpa(start, length, heads, kv_heads, head_dim, on_tiles=False)


@needs_amx
@pytest.mark.parametrize(("start", "length", "heads", "kv_heads", "head_dim"), [
    (0, 5, 9, 3, 64), (40, 33, 9, 3, 64), (250, 128, 9, 3, 64), (270, 600, 9, 3, 64),  # 600 rows: 8 tiles a task
    (250, 19, 28, 4, 128), (0, 40, 32, 32, 64),
])
def test_chunk_attention_on_amx_tiles_matches_sdpa_within_bf16s_rounding(start, length, heads, kv_heads, head_dim):
    """Queries and weights rounded to bf16 (keys and values are), sums in fp32: blocks of 32 positions across runs
    that break mid-block, tiles of 16 queries that end mid-row."""
    _chunk_attended_as_sdpa(start, length, heads, kv_heads, head_dim, on_tiles=True)


@needs_kernels
@pytest.mark.parametrize(("start", "length", "window"), [(40, 33, 16), (250, 128, 100), (0, 40, 8), (250, 19, 4096)])
def test_chunk_attention_under_a_window_matches_sdpa_with_its_mask(start, length, window):
    """Each row sees its last ``window`` positions, from runs that start at the first row's window (as a window
    group's do) or hold positions before it."""
    for first in (window_start(start, window), 0):
        _chunk_attended_as_sdpa(start, length, 9, 3, 64, on_tiles=False, window=window, first=first)


@needs_amx
@pytest.mark.parametrize(("start", "length", "window"), [(40, 33, 16), (250, 128, 100), (270, 600, 128)])
def test_chunk_attention_on_amx_tiles_under_a_window_matches_sdpa_within_bf16s_rounding(start, length, window):
    for first in (window_start(start, window), 0):
        _chunk_attended_as_sdpa(start, length, 9, 3, 64, on_tiles=True, window=window, first=first)


def _chunk_attended_as_sdpa(start: int, length: int, heads: int, kv_heads: int, head_dim: int, on_tiles: bool,
                            window: int | None = None, first: int = 0) -> None:
    """The chunk's runs hold positions ``first`` … of a shared prefix of 300 positions, then its own blocks."""
    torch.manual_seed(start)
    layer = torch.randn(2, kv_heads, 1024 + length, head_dim).bfloat16()  # [2, Hkv, P, hd]: the pool's
    seen = start + length
    runs = tuple(run for run in (slice(100 + first, 100 + min(seen, 300)), slice(600 + max(first, 300) - 300,
                                                                                 600 + seen - 300))
                 if run.stop > run.start)
    q = torch.randn(length + 2, heads, head_dim) * 0.3  # rows 0 and 1: another sequence's
    out = torch.full_like(q, 7.0)
    ChunkRuns.of(2, length, start - first, runs, on_tiles, window).attend(q, out, layer)
    keys, values = (torch.cat([layer[i, :, run] for run in runs], dim=1) for i in (0, 1))  # [Hkv, T, hd]
    mask = causal_mask(start, length, torch.float32, torch.device("cpu"), first, window)
    expected = attend(q[2:], keys, values, mask)
    if on_tiles:
        assert ((out[2:] - expected).norm() / expected.norm()).item() < 1e-2
        assert (out[2:] - expected).abs().max().item() < 0.05
    else:
        assert torch.allclose(out[2:], expected, atol=1e-5)
    assert torch.equal(out[:2], torch.full_like(out[:2], 7.0))


@needs_kernels
def test_a_damaged_library_in_the_cache_is_built_again(monkeypatch, tmp_path):
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    sources = _sources_alone(tmp_path)
    monkeypatch.setattr(variants, "HERE", sources)
    cached = build._built(support.candidates()[0][0], shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc"))
    cached.write_bytes(b"\x7fELF cut short")  # as an interrupted copy might leave it
    loads = [sys.executable, "-c", "import sys, pathlib; from engine.forward.native import build, variants; "
             f"variants.HERE = pathlib.Path({str(sources)!r}); print(build.library() is not None)"]
    result = subprocess.run(loads, capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    assert result.stdout.strip() == "True" and cached.stat().st_size > 1000


def _sources_alone(folder: Path) -> Path:
    """A copy of the kernels' sources in ``folder``, without the libraries an install may have built beside them:
    the run-time build's case (a source checkout)."""
    sources = folder / "sources"
    shutil.copytree(variants.HERE, sources, ignore=shutil.ignore_patterns("*.so", "*.dll", "__pycache__"))
    return sources


def test_a_scratch_made_under_inference_mode_serves_a_call_outside_it():
    """The scratch buffers are shared: one a model's forward pass made (under inference mode) is made again for a
    call outside it, which could not write it."""
    scratch = Scratch(torch.float32)
    with torch.inference_mode():
        scratch.take(64).fill_(1.0)
    outside = scratch.take(64)
    outside.fill_(2.0)
    assert not outside.is_inference() and torch.equal(outside, torch.full((64,), 2.0))
