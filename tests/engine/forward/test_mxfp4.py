"""MXFP4 weights (gpt-oss's experts) kept as their blocks: decoded as gguf-py decodes them, and multiplied in
Hearth's lookup-table kernel (each variant this CPU runs) or, without the kernels, in PyTorch's ops, within fp32
rounding of the matmul over the decoded weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine.forward.weights import mxfp4
from engine.forward.weights.mxfp4 import BLOCK_BYTES, Mxfp4Rows, mxfp4_linear


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


@pytest.mark.usefixtures("kernel_variant")
@pytest.mark.parametrize("count", [1, 5, 70])
def test_the_kernel_equals_the_matmul_over_the_decoded_weight(count: int):
    blocks = _blocks(96, 320, seed=count)
    weight = torch.from_numpy(dequantize(blocks, Q.MXFP4))  # [96, 320]
    bias, scale, x = torch.randn(96), torch.rand(320) + 0.5, torch.randn(count, 320)
    run, nbytes = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), bias, scale)
    assert nbytes == blocks.nbytes + 96 * 4
    torch.testing.assert_close(run(x), torch.nn.functional.linear(x * scale, weight, bias), atol=1e-3, rtol=1e-5)


def test_without_the_kernels_pytorch_decodes_each_call(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mxfp4, "library", lambda: None)
    blocks = _blocks(64, 128)
    run, _ = mxfp4_linear(Mxfp4Rows(torch.from_numpy(blocks.copy())), None, None)
    x = torch.randn(3, 128)
    torch.testing.assert_close(run(x), x @ torch.from_numpy(dequantize(blocks, Q.MXFP4)).t())
