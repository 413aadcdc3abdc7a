"""GGUF blocks read straight into the fast path's formats give the weights ``gguf.quants.dequantize`` gives.

The blocks are crafted bytes: random nibbles and 6-bit sub-scales, with sane fp16 scales written over
the random bytes where each block keeps them (or the benchmark's random blocks). 4-bit types become int4
groups of 32, exact up to the bf16 rounding of each group's scale and zero point (and exact when those are
bf16 numbers already); 5-, 6- and 8-bit types decode to gguf-py's floats and the groups those quantize to,
bit for bit.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from engine.bench.random_blocks import SCALERS, random_blocks
from engine.forward.weights.gguf_blocks import FOUR_BIT_TYPES, dense, int4_groups, requantized_groups, requantized_pair
from engine.forward.weights.gguf_codes import CODE_TYPES
from engine.forward.weights.quant import Linear
from engine.forward.weights.quant_int import Int4Groups, as_int4_pair, int4_groups_of, quantize_int4

ROWS, WIDTH = 32, 512
FP16_FIELDS = {Q.Q4_0: 1, Q.Q4_1: 2, Q.Q4_K: 2, Q.Q5_K: 2, Q.Q6_K: 0, Q.Q8_0: 1}  # leading fp16 scales
BF16_EPS = 2.0**-8  # bf16 keeps 8 significant bits: a relative rounding of at most 2**-9


def crafted_blocks(quant_type: Q, seed: int = 0, bf16_scales: bool = False) -> np.ndarray:
    """[ROWS, bytes per row] of random blocks whose fp16 scales are small and sane."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[quant_type]
    blocks = rng.integers(0, 256, size=(ROWS, WIDTH // block_size, type_size), dtype=np.uint8)
    fields = FP16_FIELDS[quant_type]
    scales = rng.uniform(0.001, 0.02, size=(ROWS, blocks.shape[1], fields))
    if bf16_scales:
        scales = torch.tensor(scales).to(torch.bfloat16).double().numpy()  # representable in bf16 and fp16 alike
    blocks[..., : 2 * fields] = scales.astype(np.float16).view(np.uint8).reshape(ROWS, blocks.shape[1], 2 * fields)
    if quant_type == Q.Q6_K:  # its fp16 scale d comes last, after 16 int8 sub-scales
        d = rng.uniform(0.001, 0.02, size=(ROWS, blocks.shape[1], 1)).astype(np.float16)
        blocks[..., -2:] = d.view(np.uint8).reshape(ROWS, blocks.shape[1], 2)
    return blocks.reshape(ROWS, -1)


def group_tolerance(groups: Int4Groups) -> torch.Tensor:
    """Per weight, what bf16 rounding of its group's scale (times |q - 8| <= 8) and zero point can move it."""
    scales, zeros = groups.scales_and_zeros.abs().transpose(0, 1).unbind(-1)  # [N, G] each
    per_group = BF16_EPS * (8 * scales + zeros) + 1e-6
    return per_group.repeat_interleave(groups.group, dim=1)  # [N, K]


def through_kernel(groups: Int4Groups) -> torch.Tensor:
    """The weights [N, K] as the CPU int4 kernel computes with them (bf16 scales and zero points, bf16 output)."""
    return Linear(groups, None, "int4")(torch.eye(groups.shape[1])).t()


@pytest.mark.parametrize("quant_type", FOUR_BIT_TYPES, ids=lambda t: t.name)
def test_four_bit_blocks_become_int4_groups_that_stand_for_the_same_weights(quant_type: Q):
    blocks = crafted_blocks(quant_type)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, quant_type))  # [N, K]
    groups = int4_groups(blocks, quant_type)
    assert groups.shape == (ROWS, WIDTH) and groups.group == 32
    assert groups.q.dtype == torch.uint8 and int(groups.q.max()) <= 15
    assert torch.equal(groups.dequantize(), expected)  # scales still in fp32: exact
    output_rounding = BF16_EPS * expected.abs()  # the kernel returns bf16
    assert (through_kernel(groups) - expected).abs().le(group_tolerance(groups) + output_rounding).all()


@pytest.mark.parametrize("in_c", [True, False], ids=["hearths-kernel", "torch-ops"])
@pytest.mark.parametrize("quant_type", FOUR_BIT_TYPES, ids=lambda t: t.name)
def test_four_bit_blocks_go_straight_into_the_cpu_kernels_layout_as_the_same_groups(quant_type: Q, in_c: bool,
                                                                                    kernel_variant: str, monkeypatch):
    """Rows in whole blocks of 64, laid out for the kernel without codes (here 64 rows at a time), in one pass of
    Hearth's C (each variant's), else in PyTorch's ops: the same groups, the same bytes as packing the codes, and
    the same products; other row counts keep the codes."""
    if not in_c:
        monkeypatch.setattr("engine.forward.weights.cpu_int4_layout.library", lambda: None)
    monkeypatch.setattr("engine.forward.weights.gguf_blocks.chunk_rows", lambda *_: 64)
    blocks = np.concatenate([crafted_blocks(quant_type, seed) for seed in range(4)])  # [128, bytes per row]
    plain, laid_out = int4_groups(blocks, quant_type), int4_groups(blocks, quant_type, cpu_layout=True)
    assert laid_out.in_cpu_layout and laid_out.shape == plain.shape == (128, WIDTH)
    assert torch.equal(laid_out.q, plain.q) and torch.equal(laid_out.scales_and_zeros, plain.scales_and_zeros)
    assert torch.equal(laid_out.cpu_packed(1), plain.cpu_packed(1))
    assert torch.equal(through_kernel(laid_out), through_kernel(plain))
    assert not int4_groups(blocks[:96], quant_type, cpu_layout=True).in_cpu_layout


def test_q4_0_blocks_with_bf16_scales_come_back_exactly_through_the_kernel():
    """Q4_0's zero point is 0, so a bf16 scale loses nothing: only the kernel's bf16 output rounds."""
    blocks = crafted_blocks(Q.Q4_0, seed=1, bf16_scales=True)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, Q.Q4_0))
    assert torch.equal(through_kernel(int4_groups(blocks, Q.Q4_0)), expected.to(torch.bfloat16).float())


@pytest.mark.parametrize("quant_type", [Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.F16, Q.BF16, Q.F32], ids=lambda t: t.name)
def test_other_types_decode_to_the_floats_they_hold(quant_type: Q):
    if quant_type in FP16_FIELDS:
        blocks = crafted_blocks(quant_type)
    else:
        weights = np.random.default_rng(2).standard_normal((ROWS, WIDTH)).astype(np.float32)
        blocks = gguf.quants.quantize(weights, quant_type) if quant_type == Q.BF16 else weights.astype(
            np.float16 if quant_type == Q.F16 else np.float32)
        blocks = blocks.view(np.uint8).reshape(ROWS, -1)
    expected = gguf.quants.dequantize(blocks, quant_type)
    got = dense(blocks, quant_type)
    assert got.dtype == torch.float32 and got.shape == (ROWS, WIDTH)
    assert np.array_equal(got.numpy(), expected)
    got.mul_(2)  # a writable copy, never the mapped file's bytes
    assert np.array_equal(gguf.quants.dequantize(blocks, quant_type), expected)


def code_type_blocks(quant_type: Q) -> list[np.ndarray]:
    """Crafted blocks (sub-scales of either sign) and, where the benchmark writes the type, its random blocks."""
    crafted = crafted_blocks(quant_type, seed=4)
    if quant_type not in SCALERS:
        return [crafted]
    return [crafted, random_blocks(quant_type, ROWS, WIDTH, 0.02, np.random.default_rng(3))]


@pytest.mark.parametrize("quant_type", CODE_TYPES, ids=lambda t: t.name)
def test_five_six_and_eight_bit_blocks_decode_to_gguf_floats_and_their_int4_groups(quant_type: Q):
    for blocks in code_type_blocks(quant_type):
        expected = torch.from_numpy(gguf.quants.dequantize(blocks, quant_type))  # [N, K]
        assert torch.equal(dense(blocks, quant_type), expected)
        groups, quantized = requantized_groups(blocks, quant_type), int4_groups_of(expected)
        assert groups.q.dtype == torch.uint8 and torch.equal(groups.q, quantized.q)
        assert torch.equal(groups.scales_and_zeros, quantized.scales_and_zeros)


@pytest.mark.parametrize("quant_type", CODE_TYPES, ids=lambda t: t.name)
def test_an_output_layer_of_five_six_or_eight_bits_comes_as_two_planes_of_what_the_blocks_hold(quant_type: Q):
    blocks = crafted_blocks(quant_type, seed=5)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, quant_type))  # [N, K]
    pair = requantized_pair(blocks, quant_type)
    assert torch.equal(pair.dequantize(), as_int4_pair(expected).dequantize())
    relative = (pair.dequantize() - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()
    assert relative < 0.01  # one plane: about 0.06 (the test below)


@pytest.mark.parametrize("quant_type", FOUR_BIT_TYPES, ids=lambda t: t.name)
def test_a_4bit_output_layer_comes_as_its_own_groups_alone(quant_type: Q):
    blocks = crafted_blocks(quant_type, seed=6)
    pair = requantized_pair(blocks, quant_type)
    assert pair.fine is None
    assert torch.equal(pair.dequantize(), torch.from_numpy(gguf.quants.dequantize(blocks, quant_type)))


def test_six_bit_layers_requantized_into_4_bit_groups_keep_a_small_error():
    """Q6_K layers (a Q4_K_M file keeps a few) in groups of 32 for the 4-bit decode copy: the error, measured."""
    weights = dense(crafted_blocks(Q.Q6_K), Q.Q6_K)  # [N, K]
    q, scales_and_zeros = quantize_int4(weights, 32)
    error = Int4Groups(q, scales_and_zeros.float(), 32).dequantize() - weights
    relative_rms = float(error.pow(2).mean().sqrt() / weights.pow(2).mean().sqrt())
    assert 0.01 < relative_rms < 0.12  # uniform random 6-bit codes: ~1/16 of the range per step, as 4 bits give


def test_large_tensors_decoded_a_few_rows_at_a_time_come_out_whole(monkeypatch: pytest.MonkeyPatch):
    from engine.forward.weights import quant_int

    monkeypatch.setattr(quant_int, "ROWS_AT_ONCE", 7)  # 32 rows: four chunks and a short one
    monkeypatch.setattr(quant_int, "WEIGHTS_AT_ONCE", 7 * WIDTH)  # blocks: 7 rows at a time too
    for quant_type in (Q.Q4_K, Q.Q4_0):
        blocks = crafted_blocks(quant_type)
        assert torch.equal(int4_groups(blocks, quant_type).dequantize(),
                           torch.from_numpy(gguf.quants.dequantize(blocks, quant_type)))
    six_bit = crafted_blocks(Q.Q6_K)
    whole = quantize_int4(dense(six_bit, Q.Q6_K), 32)
    chunked = requantized_groups(six_bit, Q.Q6_K)
    assert torch.equal(chunked.q.int(), whole[0]) and torch.equal(chunked.scales_and_zeros, whole[1].float())


def test_rows_reordered_concatenated_and_scaled_keep_their_groups():
    blocks = crafted_blocks(Q.Q4_1)
    groups, weights = int4_groups(blocks, Q.Q4_1), torch.from_numpy(gguf.quants.dequantize(blocks, Q.Q4_1))
    order = torch.randperm(ROWS)
    assert torch.equal(groups.rows(order).dequantize(), weights[order])
    assert torch.allclose(groups.scaled(0.125).dequantize(), weights * 0.125)
    assert torch.equal(Int4Groups.cat([groups, groups.rows(order)]).dequantize(), torch.cat([weights, weights[order]]))
