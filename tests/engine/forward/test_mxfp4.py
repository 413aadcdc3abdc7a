"""MXFP4 weights (gpt-oss's experts) kept as their blocks: decoded as gguf-py decodes them, and multiplied in
Hearth's kernel (each variant this CPU runs): int8 products of the weights and the activations' int8 codes, within
fp32 rounding of the matmul of the rounded activations by the decoded weight, or with fp32 activations (the fp32
plan) of the exact matmul; without the kernels, in PyTorch's ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine.forward.native import activation_codes
from engine.forward.native.build import kernels
from engine.forward.native.int4_matmul import AMX_ROWS, runs_on_amx
from engine.forward.weights import mxfp4
from engine.forward.weights.mxfp4 import BLOCK_BYTES, Mxfp4Rows, mxfp4_linear
from engine.forward.weights.quant import Linear


def _blocks(rows: int, width: int, seed: int = 0) -> np.ndarray:
    """gpt-oss-like weights (a spread of magnitudes across blocks) quantized by gguf-py: [rows, width / 32 * 17]."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((rows, width)) * np.exp(rng.uniform(-6, 3, size=(rows, width // 32, 1))).repeat(
        32, axis=2).reshape(rows, width)
    return quantize(weights.astype(np.float32), Q.MXFP4)


def test_the_blocks_decode_as_gguf_py_decodes_them_at_every_exponent():
    blocks = _blocks(8, 256 * 32)
    blocks.reshape(-1, BLOCK_BYTES)[:, 0] = np.arange(8 * 256) % 251  # e8m0 0 ... 250, subnormal scales too
    decoded = Mxfp4Rows(torch.from_numpy(blocks.copy())).dequantize()
    assert torch.equal(decoded, torch.from_numpy(dequantize(blocks, Q.MXFP4)))


def _rounded(x: torch.Tensor, codes: int) -> torch.Tensor:
    """``x`` [M, K] as the kernel rounds it (``quantize_activations``): per block of 32, int8 codes under the block's
    largest magnitude over 127, and with two codes a second for what the first left, in steps of 1/254 of it."""
    blocks = x.unflatten(1, (-1, 32))  # [M, B, 32]
    scales = blocks.abs().amax(-1, keepdim=True) / 127
    scaled = blocks * (1 / torch.where(scales > 0, scales, 1.0))  # as the kernel scales them
    high = torch.round(scaled)
    low = torch.round((scaled - high) * 254) if codes == 2 else torch.zeros_like(high)
    return ((high + low / 254) * scales).flatten(1)


@pytest.fixture
def strips_variant(kernel_variant: str) -> str:
    """Each variant this CPU runs whose MXFP4 kernels read strips (``Variant.mxfp4_strips``)."""
    if not kernels().mxfp4_strips:
        pytest.skip(f"the {kernel_variant} variant reads the file's rows of blocks")
    return kernel_variant


@pytest.mark.usefixtures("strips_variant")
def test_strips_hold_each_rows_blocks_where_the_x86_kernels_read_them():
    """``in_strips``: a strip block's exponents, row r's at r, then code byte 4j + i of row r at 32j + 4r + i; rows
    past the weight's (12 here, in strips of 8) are zero blocks."""
    blocks = torch.from_numpy(_blocks(12, 64))  # [12, 2 * 17]
    strips = mxfp4.in_strips(Mxfp4Rows(blocks)).view(2, 2, 8 * BLOCK_BYTES)  # [strip, block, 136]
    for row in range(12):
        s, r = divmod(row, 8)
        for b in range(2):
            block = blocks[row, BLOCK_BYTES * b : BLOCK_BYTES * (b + 1)]
            assert strips[s, b, r] == block[0]
            for code in range(16):
                j, i = divmod(code, 4)
                assert strips[s, b, 8 + 32 * j + 4 * r + i] == block[1 + code]
    padding = strips[1, :, 8:].unflatten(-1, (4, 8, 4))[:, :, 4:]  # rows 12 .. 15's codes
    assert not strips[1, :, 4:8].any() and not padding.any()


@pytest.mark.usefixtures("strips_variant")
def test_blocks_handed_over_at_load_become_strips_in_place_and_others_stay_as_read():
    blocks = _blocks(96, 352)
    kept = Mxfp4Rows(torch.from_numpy(blocks.copy()))
    handed = Mxfp4Rows(torch.from_numpy(blocks.copy()), handed_over=True)
    kept_run, handed_run = mxfp4_linear(kept, None, None)[0], mxfp4_linear(handed, None, None)[0]
    assert np.array_equal(kept.blocks.numpy(), blocks)  # another matmul of the same rows reads them as they were
    assert handed_run.blocks.data_ptr() == handed.blocks.data_ptr()  # no copy: the load's own pages hold the strips
    x = torch.randn(2, 352)
    assert torch.equal(kept_run(x), handed_run(x))


@pytest.mark.usefixtures("kernel_variant")
@pytest.mark.parametrize("sequences", [1, 3])  # one sequence's step, a batched one
@pytest.mark.parametrize(("count", "width"), [(1, 320), (1, 352), (3, 352), (5, 352), (70, 320)])  # 352: 11 blocks
@pytest.mark.parametrize("rows", [96, 100])  # 100: past a whole number of strips of 8 (avx2) or 16 (avx512)
def test_the_kernel_is_the_matmul_of_its_rounded_activations_by_the_decoded_weight(
        count: int, width: int, sequences: int, rows: int, monkeypatch: pytest.MonkeyPatch):
    """Two codes a value for one row of one sequence (a decode step), else one (``ONE_CODE_ROWS``); the int8 kernel
    even where AMX's tiles would take many rows."""
    monkeypatch.setattr(mxfp4, "runs_on_amx", lambda: False)
    torch.manual_seed(count)
    blocks = _blocks(rows, width, seed=count)
    weight = torch.from_numpy(dequantize(blocks, Q.MXFP4))  # [N, K]
    bias, scale = torch.randn(rows), torch.rand(width) + 0.5
    x = torch.randn(count, width) * torch.logspace(-2, 1, width)  # blocks of very different sizes
    run, nbytes = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), bias, scale)
    assert nbytes == run.blocks.numel() + rows * 4 and run.blocks.numel() - blocks.nbytes < 8 * blocks.shape[1]
    with activation_codes.for_step(sequences):
        got = run(x)
    codes = 2 if sequences == 1 and count < mxfp4.ONE_CODE_ROWS else 1
    exact = torch.nn.functional.linear(x * scale, weight, bias)
    largest = (exact - bias).abs().max()
    rounded = torch.nn.functional.linear(_rounded(x * scale, codes), weight, bias)
    assert ((got - rounded).abs().max() / largest).item() < 2e-6  # the integer sums are exact
    assert ((got - exact).abs().max() / largest).item() < (1e-4 if codes == 2 else 3e-2)  # Q8_0: about 1 %


@pytest.mark.skipif(not runs_on_amx(), reason="no AMX bf16 tiles (or no kernels) here")
@pytest.mark.parametrize(("count", "width"), [(AMX_ROWS, 352), (70, 320), (512, 352)])
def test_many_rows_on_amx_tiles_are_their_bf16_rounding_times_the_exact_weight(count: int, width: int):
    """Prompt chunks: the activations rounded to bf16 (padded to whole passes of tile products), the weights exact
    in bf16, sums in fp32."""
    torch.manual_seed(count)
    blocks = _blocks(96, width, seed=count)
    weight = torch.from_numpy(dequantize(blocks, Q.MXFP4))  # [96, K]
    bias, scale = torch.randn(96), torch.rand(width) + 0.5
    x = torch.randn(count, width) * torch.logspace(-2, 1, width)
    run, _ = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), bias, scale)
    got = run(x)
    rounded = torch.nn.functional.linear((x * scale).bfloat16().double(), weight.double(), bias.double()).float()
    exact = torch.nn.functional.linear(x * scale, weight, bias)
    largest = (exact - bias).abs().max()
    assert ((got - rounded).abs().max() / largest).item() < 1e-5
    assert ((got - exact).abs().max() / largest).item() < 1e-2  # bf16's 8 bits: under int8's one code


@pytest.mark.usefixtures("kernel_variant")
@pytest.mark.parametrize("count", [1, 5, 70])
def test_exact_keeps_the_activations_and_equals_the_matmul_over_the_decoded_weight(count: int):
    """The fp32 plan's experts."""
    blocks = _blocks(100, 352, seed=count)
    weight = torch.from_numpy(dequantize(blocks, Q.MXFP4))  # [100, 352]
    bias, scale, x = torch.randn(100), torch.rand(352) + 0.5, torch.randn(count, 352)
    run, _ = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), bias, scale, exact=True)
    torch.testing.assert_close(run(x), torch.nn.functional.linear(x * scale, weight, bias), atol=1e-3, rtol=1e-5)


@pytest.mark.usefixtures("kernel_variant")
def test_a_layer_of_mxfp4_blocks_keeps_one_call_whatever_its_decode_copy_format():
    """A dense layer's plan may ask for a decode copy beside the prompts' (int8 beside fp16): MXFP4 blocks read at
    load (handed over, so the first call may rearrange them in place) stay one call over them, for any rows."""
    blocks = _blocks(96, 352)
    weight = torch.from_numpy(dequantize(blocks, Q.MXFP4))  # [96, 352]
    layer = Linear(Mxfp4Rows(torch.from_numpy(blocks.copy()), handed_over=True), None, "fp16", one_row_fmt="int8")
    assert layer.nbytes == layer.one_row_nbytes == blocks.nbytes
    for count in (1, 5):
        x = torch.randn(count, 352)
        exact = x @ weight.t()
        assert ((layer(x) - exact).abs().max() / exact.abs().max()).item() < 3e-2


def test_without_the_kernels_pytorch_decodes_each_call(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mxfp4, "library", lambda: None)
    blocks = _blocks(64, 128)
    run, _ = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), None, None)
    x = torch.randn(3, 128)
    torch.testing.assert_close(run(x), x @ torch.from_numpy(dequantize(blocks, Q.MXFP4)).t())


@pytest.mark.usefixtures("kernel_variant")
@pytest.mark.parametrize("codes", [2, 1])  # a decode step's experts, a batched step's
def test_a_steps_experts_in_one_call_are_each_rows_rounded_activations_times_its_experts_weight(codes: int):
    """``Mxfp4Experts``: each expert's rows (1 to 5, past a tile of 4) times its own weight plus its own bias (or
    none), the integer sums exact; experts no row picked are skipped."""
    torch.manual_seed(codes)
    blocks = [_blocks(100, 352, seed=e) for e in range(6)]
    biases = [torch.randn(100) if e % 2 else None for e in range(6)]
    matmuls = [mxfp4_linear(Mxfp4Rows(torch.from_numpy(b.copy())), bias, None)[0] for b, bias in zip(blocks, biases)]
    active, counts = torch.tensor([0, 2, 3, 5]), torch.tensor([1, 5, 2, 1])
    x = torch.randn(int(counts.sum()), 352) * torch.logspace(-2, 1, 352)
    got = mxfp4.Mxfp4Experts.of(matmuls)(x, active, counts, codes)
    for e, rows, out in zip(active.tolist(), x.split(counts.tolist()), got.split(counts.tolist())):
        weight = torch.from_numpy(dequantize(blocks[e], Q.MXFP4))  # [100, K]
        rounded = torch.nn.functional.linear(_rounded(rows, codes), weight, biases[e])
        largest = torch.nn.functional.linear(rows, weight).abs().max()
        assert ((out - rounded).abs().max() / largest).item() < 2e-6


def test_experts_join_in_one_call_only_as_kernel_calls_of_rounded_activations():
    blocks = Mxfp4Rows(torch.from_numpy(_blocks(64, 128)))
    joining = mxfp4_linear(blocks, None, None)[0]
    assert mxfp4.Mxfp4Experts.of([joining, joining]) is not None
    assert mxfp4.Mxfp4Experts.of([joining, mxfp4_linear(blocks, None, None, exact=True)[0]]) is None  # the fp32 plan
    assert mxfp4.Mxfp4Experts.of([joining, mxfp4_linear(blocks, None, torch.ones(128))[0]]) is None  # a scaled input
