"""A Q8_0 file's blocks as int8 groups: read as gguf-py reads them, reordered, scaled and joined as the weights they
stand for, and laid out for the int8 kernel as they are."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from engine.bench.random_blocks import random_blocks
from engine.forward.native import gguf_layout, int8_matmul
from engine.forward.weights.int8_groups import Int8Groups

ROWS, WIDTH = 128, 256


def _groups(seed: int) -> tuple[np.ndarray, Int8Groups]:
    """Random Q8_0 blocks [N, bytes] (uniform codes: a block's largest is seldom 127) and their int8 groups."""
    blocks = random_blocks(Q.Q8_0, ROWS, WIDTH, 0.05, np.random.default_rng(seed))
    return blocks, Int8Groups.from_q8_0(blocks)


def test_q8_0_blocks_read_as_gguf_py_reads_them():
    blocks, groups = _groups(0)
    assert groups.shape == (ROWS, WIDTH) and groups.codes.dtype == torch.int8
    assert torch.equal(groups.dequantize(), torch.from_numpy(gguf.quants.dequantize(blocks, Q.Q8_0)))


def test_rows_reordered_scaled_and_joined_stay_the_weights_they_stand_for():
    (_, groups), (_, other) = _groups(1), _groups(2)
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(0))
    assert torch.equal(groups.rows(order).dequantize(), groups.dequantize()[order])
    assert torch.equal(groups[32:96].dequantize(), groups.dequantize()[32:96])
    assert torch.equal(Int8Groups.cat([groups, other]).dequantize(),
                       torch.cat([groups.dequantize(), other.dequantize()]))
    assert torch.equal(groups.scaled(0.125).dequantize(), groups.dequantize() * 0.125)


def _lay_out_in_c_or_pytorch(in_c: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 layout made in C (``gguf_layout``) or in PyTorch's ops; skips where the kernel or the compiler is
    missing."""
    if not int8_matmul.covers(ROWS, WIDTH):
        pytest.skip("Hearth's int8 kernel does not run here")
    if in_c and not gguf_layout.available():
        pytest.skip("no C compiler here")
    if not in_c:
        monkeypatch.setattr(gguf_layout, "available", lambda: False)


@pytest.mark.parametrize("in_c", [True, False])
def test_the_int8_kernel_reads_a_files_groups_as_they_are(in_c: bool, monkeypatch: pytest.MonkeyPatch):
    """Each weight as the kernel reads it (the identity's rows multiplied) is the file's, in C and in PyTorch's ops;
    the same weights quantized again from fp32 are not (a block's scale is its largest code's, not 127's)."""
    _lay_out_in_c_or_pytorch(in_c, monkeypatch)
    _, groups = _groups(3)
    identity = torch.eye(WIDTH)
    read = int8_matmul.Int8Matmul(groups)(identity).t()  # [N, K]
    torch.testing.assert_close(read, groups.dequantize(), rtol=1e-6, atol=0.0)
    requantized = int8_matmul.Int8Matmul(groups.dequantize())(identity).t()  # [N, K]
    assert not torch.allclose(requantized, groups.dequantize(), rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("in_c", [True, False])
def test_a_tied_tables_rows_come_from_the_output_layers_codes_as_the_file_holds_them(
        in_c: bool, monkeypatch: pytest.MonkeyPatch):
    """A token looked up in the int8 output layer (``OutputRows``) gets the file's Q8_0 row exactly, whichever way
    the layer was laid out."""
    _lay_out_in_c_or_pytorch(in_c, monkeypatch)
    _, groups = _groups(4)
    tokens = torch.tensor([0, 17, 63, 64, 100, 127, 17])  # rows of both blocks, all four vectors, one twice
    rows = int8_matmul.Int8Matmul(groups).rows(tokens)  # [7, K]
    assert torch.equal(rows, groups.dequantize()[tokens])
