"""The integer weight formats on the CPU: int8 rows and int4 groups, exact 4-bit GGUF blocks, the models they make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.native import int4_scales
from engine.forward.native import int4_matmul as native_int4
from engine.forward.native import int8_matmul as native_int8
from engine.forward.weights.quant import Linear, few_rows
from engine.forward.weights import int4_prompts
from engine.forward.weights.cpu_int4_layout import codes_from_packed, packed_from_codes
from engine.forward.weights.quant_int import (
    CPU_INT4_GROUP, INT4_PAIR, Int4Groups, Int4Pair, _int4_packed, as_int4_pair, dequantize_int4,
    int4_groups_of, int4_layout, pack_quantized, quantize_int4, quantize_int8,
)
from engine.host.cpu_features import has_fp16_math
from engine.models.random_models import build_hf_model
from tests.engine.forward.batch_of_one import prompt_logits
from tests.engine.forward.triton_interpreter import assert_passes_in_the_interpreter
from tests.engine.forward.formats import fast_plan

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def test_int8_rows_round_to_within_half_a_step():
    torch.manual_seed(0)
    weight = torch.randn(96, 200) * torch.rand(96, 1) * 3  # rows of different ranges
    q, scales = quantize_int8(weight)
    assert q.dtype == torch.int8 and scales.shape == (96,)
    error = (q.float() * scales.float().unsqueeze(1) - weight).abs()
    assert (error <= scales.float().unsqueeze(1) * 0.5 + 1e-6).all()


def test_int4_groups_round_to_within_half_a_step_and_the_cpu_kernel_agrees():
    torch.manual_seed(0)
    weight, x = torch.randn(64, 256), torch.randn(3, 256)
    group, tiles = int4_layout(64, 256, CUDA)
    q, scales_and_zeros = quantize_int4(weight, group)
    assert q.min() >= 0 and q.max() <= 15 and scales_and_zeros.shape == (256 // group, 64, 2)
    restored = dequantize_int4(q, scales_and_zeros, group)
    step = scales_and_zeros[..., 0].float().transpose(0, 1).repeat_interleave(group, dim=1)  # [N, K]
    assert ((restored - weight).abs() <= step * 0.5 + 0.02).all()  # + bf16 rounding of the zero point
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, tiles)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, group, scales_and_zeros)
    torch.testing.assert_close(got.float(), x @ restored.T, rtol=0.02, atol=0.2)


@pytest.mark.parametrize("rows", [64, 960, 80, 112])
def test_the_cpu_packing_lays_the_codes_out_as_the_kernels_own_op_does(rows: int):
    """Built from uint8 codes (the op takes int32): whole 64-row blocks by hand, a last block of 16-48 by the op;
    whole blocks unpack back into the same codes."""
    codes = torch.randint(0, 16, (rows, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))
    expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    assert torch.equal(packed_from_codes(codes, 1), expected)
    if rows % 64 == 0:
        assert torch.equal(codes_from_packed(expected), codes)


PROMPT_PATHS = {  # runs_on_amx, the avx512 variant's strips take prompts, has_int8_dot
    "amx": (True, False, True), "strips": (False, True, True), "int8": (False, False, True),
    "fp32": (False, False, False),
}
PROMPT_ERROR = {"fp32": 1e-6, "strips": 0.02}  # else 0.01


@pytest.mark.parametrize("path", PROMPT_PATHS)
@pytest.mark.parametrize("rows, width", [(192, 256), (64, 1536)])
def test_a_prompt_over_4bit_weights_multiplies_within_a_percent_and_few_rows_keep_the_kernel(
        rows, width, path, monkeypatch):
    """From ``PROMPT_ROWS`` rows on, a prompt multiplies on AMX's bf16 tiles where the CPU has them (Hearth's int4
    kernel), or on the avx512 variant's strips, one int8 code an activation per group of 32 (llama.cpp's Q8_0): a
    channel 100x the others' coarsens its group alone, within 2 %; else the packed weights are unpacked block by
    block (here three blocks of 64 rows, or one): into int8, multiplied with two int8 codes per activation, where
    it has int8 dot products, so that channel stays exact; else into fp32, which is exact."""
    amx, strips, int8_dot = PROMPT_PATHS[path]
    if amx and not native_int4.runs_on_amx():
        pytest.skip("no AMX bf16 tiles here")
    if strips and not native_int4.takes_prompts():
        pytest.skip("the avx512 variant of Hearth's kernels does not run here")
    for scratch in ("SCRATCH_WEIGHTS", "FP32_SCRATCH_WEIGHTS"):
        monkeypatch.setattr(int4_prompts, scratch, 64 * 256)
    monkeypatch.setattr(native_int4, "runs_on_amx", lambda: amx)
    monkeypatch.setattr(native_int4, "takes_prompts", lambda: amx or strips)
    monkeypatch.setattr(int4_prompts, "has_int8_dot", lambda: int8_dot)
    generator = torch.Generator().manual_seed(rows)
    q, scales_and_zeros = quantize_int4(torch.randn(rows, width, generator=generator), CPU_INT4_GROUP)
    scales_and_zeros = scales_and_zeros.to(torch.bfloat16)
    run, _ = _int4_packed(Int4Groups(q.to(torch.uint8), scales_and_zeros, CPU_INT4_GROUP), 2)
    if native_int4.covers(rows, width, CPU_INT4_GROUP):  # the scales as Hearth's kernels keep them
        scales_and_zeros = int4_scales.scales_and_zeros_of(int4_scales.block_scales(scales_and_zeros),
                                                           width // CPU_INT4_GROUP)
    weight = dequantize_int4(q, scales_and_zeros.float(), CPU_INT4_GROUP)  # [N, K]
    prompt, few = torch.randn(int4_prompts.PROMPT_ROWS, width, generator=generator), torch.randn(8, width)
    prompt[:, 5] *= 100
    exact = prompt @ weight.T
    assert (run(prompt) - exact).norm() < PROMPT_ERROR.get(path, 0.01) * exact.norm()
    kernel_error = (run(few) - few @ weight.T).abs().max()
    assert 1e-3 < kernel_error < 0.5, "few rows stay on the int4 kernel, with its bf16 activations"


def test_an_int4_pair_holds_a_weight_to_a_fifteenth_of_a_4bit_step_in_twice_the_bytes(monkeypatch):
    """The second plane quantizes what the first's rounding left; rows are made a few at a time (here 48)."""
    monkeypatch.setattr("engine.forward.weights.quant_int.WEIGHTS_AT_ONCE", 48 * 256)
    weight = torch.randn(128, 256, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.1, 2, 128)[:, None]
    pair = as_int4_pair(weight)
    one_plane = int4_groups_of(weight).dequantize()
    assert len(pair.planes) == 2 and pair.shape == weight.shape
    coarse_error, pair_error = (one_plane - weight).abs().max(), (pair.dequantize() - weight).abs().max()
    assert pair_error < coarse_error / 10
    run, nbytes = pack_quantized(pair, None, INT4_PAIR)
    _, one_plane_bytes = pack_quantized(weight, None, "int4")
    assert nbytes == 2 * one_plane_bytes
    x = torch.randn(4, 256)
    exact, one_plane_run = x @ weight.T, pack_quantized(weight, None, "int4")[0]
    assert (run(x) - exact).abs().max() < (one_plane_run(x) - exact).abs().max() / 4


def test_an_int4_pair_of_4bit_groups_keeps_them_as_one_exact_plane():
    groups = int4_groups_of(torch.randn(64, 128))
    pair = as_int4_pair(groups)
    assert pair == Int4Pair(groups, None) and len(pair.planes) == 1
    run, nbytes = pack_quantized(pair, None, INT4_PAIR)
    assert nbytes == pack_quantized(groups, None, "int4")[1]
    x = torch.randn(3, 128)
    torch.testing.assert_close(run(x), pack_quantized(groups, None, "int4")[0](x))


def test_int4_layout_picks_the_largest_group_on_a_gpu_and_refuses_odd_shapes():
    assert int4_layout(4096, 14336, CUDA) == (128, 8)
    assert int4_layout(576, 576, CUDA) == (64, 4)
    assert int4_layout(128, 96, CUDA) == (32, 2)
    assert int4_layout(300, 64, CUDA) is None, "rows must be a multiple of 8"
    assert int4_layout(64, 48, CUDA) is None, "width must be a multiple of 32"


def test_int4_layout_on_the_cpu_takes_llama_cpp_blocks_of_32():
    assert int4_layout(576, 1536, CPU) == (32, 1)
    assert int4_layout(4096, 14336, CPU) == (32, 1)
    assert int4_layout(24, 64, CPU) is None, "the CPU kernel packs rows in sixteens"
    assert int4_layout(64, 48, CPU) is None


def _q4_1_blocks(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """A weight as a Q4_1 GGUF file stores it: per 32 weights ``d * q + m``, q in 0…15, both ends used.

    ``d`` and ``m + 8 d`` are chosen representable in bf16, as the kernel keeps them.
    """
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, width // 32, 32), generator=generator)
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(rows, width // 32, 1, generator=generator) / 64).bfloat16().float()
    zero = (torch.randn(rows, width // 32, 1, generator=generator) / 16).bfloat16().float()
    return ((q - 8) * d + zero).reshape(rows, width)


def test_a_4bit_gguf_block_comes_back_exactly_and_norm_weights_do_not_disturb_it():
    weight, norm, x = _q4_1_blocks(64, 256), torch.rand(256) + 0.5, torch.randn(3, 256)
    q, scales_and_zeros = quantize_int4(weight, 32)
    assert torch.equal(dequantize_int4(q, scales_and_zeros, 32), weight)
    got = Linear(weight, None, "int4", input_scale=norm)(x)  # the norm scales x: folding it would break the blocks
    torch.testing.assert_close(got, (x * norm) @ weight.T, rtol=2e-2, atol=2e-2)  # bf16 activations


def test_fp16_with_a_4bit_decode_copy_answers_few_rows_from_the_copy_and_many_from_fp16():
    weight, norm = _q4_1_blocks(96, 128), torch.rand(128) + 0.5
    dual = Linear(weight, None, "fp16", norm, one_row_fmt="int4")
    fp16, int4 = Linear(weight, None, "fp16", norm), Linear(weight, None, "int4", norm)
    prompt, decode_step = torch.randn(few_rows() + 1, 128), torch.randn(few_rows(), 128)
    assert torch.equal(dual(prompt), fp16(prompt)) and torch.equal(dual(decode_step), int4(decode_step))
    assert dual.nbytes == fp16.nbytes + int4.nbytes


def test_linear_in_quantized_formats_is_close_to_fp32_and_smaller():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(128, 256) / 16, torch.randn(128), torch.randn(4, 256)
    exact = Linear(weight, bias, "fp32")
    for fmt, max_bytes in (("int8", 128 * 256 * 1.1), ("int4", 128 * 256 * 0.7)):
        packed = Linear(weight, bias, fmt)
        assert packed.nbytes < max_bytes
        assert torch.nn.functional.cosine_similarity(packed(x), exact(x), dim=-1).min() > 0.99


def _dequantized(state: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Every layer weight replaced by what ``fmt`` stores for it on the CPU, in fp32 (int4's misfits fall back to
    int8, in groups of 32 where Hearth's kernel takes them, else a scale a row); the token table and output layer too under int4 (two planes of 4-bit groups there), as they are under
    int8 (fp16)."""

    def restore(name: str, weight: torch.Tensor) -> torch.Tensor:
        if weight.dim() != 2 or (fmt == "int8" and name.endswith(("embed_tokens.weight", "lm_head.weight"))):
            return weight
        layout = int4_layout(*weight.shape, CPU) if fmt == "int4" else None
        table = name.endswith("embed_tokens.weight")  # looked up row by row: in planes whatever its shape
        if table or (layout is not None and name.endswith("lm_head.weight")):
            return as_int4_pair(weight).dequantize()
        if layout is None and native_int8.covers(64, weight.shape[1]):  # groups of 32 on Hearth's CPU kernel (the
            # tiny model's matrices fill whole blocks of 64 rows: q, k and v together, gate and up together)
            q, scales = native_int8.quantize(weight)
            return (q.float().unflatten(1, (-1, 32)) * scales.float().unsqueeze(-1)).flatten(1)
        if layout is None:
            q, scales = quantize_int8(weight)
            return q.float() * scales.float().unsqueeze(1)
        return dequantize_int4(*quantize_int4(weight, layout[0]), layout[0])

    return {name: restore(name, weight) for name, weight in state.items()}


def _layer_bytes(model: FastLlama) -> int:
    return model.weight_bytes - model.lm_head.nbytes - model.embed.nbytes


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_fast_llama_computes_with_exactly_the_quantized_weights(fmt):
    hf_model = build_hf_model("tiny", CPU, torch.float32)
    state = hf_model.state_dict()
    quantized = FastLlama(hf_model.config, state, fast_plan(hf_model.config, fmt, CPU), CPU)
    reference = FastLlama(hf_model.config, _dequantized(state, fmt), fast_plan(hf_model.config, "fp32", CPU),
                          CPU)
    assert _layer_bytes(quantized) < 0.5 * _layer_bytes(reference)  # int8's output layer is fp16, FBGEMM-padded
    prompt = list(range(3, 40))
    expected = prompt_logits(FastLlamaBackend(reference), prompt)
    got = prompt_logits(FastLlamaBackend(quantized), prompt)
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.999  # bf16 activations in the int4 kernel


def test_int8_fast_llama_logits_stay_close_to_fp32():
    hf_model = build_hf_model("tiny", CPU, torch.float32)
    exact = FastLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU)
    int8 = FastLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "int8", CPU), CPU)
    prompt = list(range(3, 40))
    expected, got = prompt_logits(FastLlamaBackend(exact), prompt), prompt_logits(FastLlamaBackend(int8), prompt)
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.99


def test_triton_int8_kernel_matches_the_reference_in_the_interpreter():
    """Triton's interpreter runs the GPU kernel on the CPU; skipped where Triton is not installed."""
    script = (
        "import torch\n"
        "from engine.forward.weights.triton_gemv import int8_gemv\n"
        "torch.manual_seed(0)\n"
        "for n, k, block in ((300, 64, (8, 32)), (37, 100, (16, 64)), (64, 1024, (8, 512))):\n"
        "    w = torch.randint(-127, 128, (n, k), dtype=torch.int8); s = torch.rand(n) / 100; x = torch.randn(1, k)\n"
        "    torch.testing.assert_close(int8_gemv(x, w, s, block), (x @ w.float().T) * s, rtol=1e-4, atol=1e-4)\n"
        "print('ok')\n"
    )
    assert_passes_in_the_interpreter(script)


_HELD_BYTES_SCRIPT = """
import json, os, sys
import torch
from engine.forward.weights.quant import Linear
from engine.host.allocator import return_freed_memory

def resident_bytes():
    return_freed_memory()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

rows, width, decode_copy = json.loads(sys.argv[1])
weight = torch.randn(rows, width)  # [N, K]
copy_bytes = Linear(weight, None, decode_copy).nbytes if decode_copy else 0
before = resident_bytes()
layers = [Linear(weight, None, "fp16", one_row_fmt=decode_copy) for _ in range(8)]
print(json.dumps({"grown": resident_bytes() - before, "nbytes": layers[0].nbytes, "copy_bytes": copy_bytes}))
"""


def _held_bytes(rows: int, width: int, decode_copy: str | None) -> dict[str, int]:
    """Builds eight fp16 layers in a fresh interpreter, whose heap holds no freed pages of earlier tests that the
    layers could reuse unseen, and returns how far its resident set grew beside what the layers say they hold."""
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    done = subprocess.run([sys.executable, "-c", _HELD_BYTES_SCRIPT, json.dumps([rows, width, decode_copy])],
                          capture_output=True, text=True, env=environment, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident size from /proc")
@pytest.mark.parametrize("rows, width, decode_copy, row_bytes", [
    (2048, 576, None, 1024 * 2), (2048, 576, "int4", 512 * 2 + 64 * 4), (1024, 576, "int4", 1024 * 2),
    (2048, 896, "int4", 1024 * 2), (2048, 1536, "int4", 1536 * 2),
])
def test_an_fp16_layers_bytes_are_what_its_packing_holds(rows: int, width: int, decode_copy: str | None, row_bytes: int):
    """FBGEMM packs the width in blocks of 512, padding the last. Beside a decode copy SmolLM2's 576 keeps its last
    64 columns in fp32 instead (less than 448 columns of zeros) where the rows are many (2048); Qwen2.5-0.5B's 896
    is padded to 1024 either way. The figure counts what is held (the decode copy's bytes apart)."""
    held = _held_bytes(rows, width, decode_copy)
    assert held["nbytes"] == rows * row_bytes + held["copy_bytes"]
    assert abs(held["grown"] - 8 * held["nbytes"]) <= 0.1 * 8 * held["nbytes"]


@pytest.mark.skipif(not has_fp16_math(), reason="oneDNN's fp16 matmul is used only where the CPU has AVX512-FP16")
def test_a_large_prompt_only_fp16_copy_runs_on_onednn_within_fp16_rounding_and_survives_fp16_overflow():
    torch.manual_seed(0)
    weight, bias = torch.randn(2048, 2048) * 0.02, torch.randn(2048)  # 4 M weights: ``ONEDNN_FP16_WEIGHTS``
    layer = Linear(weight, bias, "fp16", one_row_fmt="int4")
    assert layer.nbytes == 2048 * 2048 * 2 + Linear(weight, bias, "int4").nbytes
    past_the_copy = few_rows() + 1  # fewer rows are the int4 decode copy's
    for rows in (past_the_copy, 300):
        x = torch.randn(rows, 2048)
        expected = x.double() @ weight.double().T + bias.double()
        got = layer(x)
        assert got.dtype == torch.float32
        assert ((got.double() - expected).norm() / expected.norm()) < 1e-3
    loud = Linear(weight * 25, bias * 100, "fp16", one_row_fmt="int4")
    huge = torch.randn(past_the_copy, 2048) * 3000  # sums up to about 10^5, past fp16's 65 504
    expected = huge.double() @ (weight.double() * 25).T + bias.double() * 100
    got = loud(huge)
    assert expected.abs().max() > 65504 and torch.isfinite(got).all()
    assert ((got - expected).abs() <= 1e-3 * expected.abs().max()).all()
