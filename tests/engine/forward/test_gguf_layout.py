"""The load's C conversion (``native.gguf_layout``) gives the weights the NumPy/PyTorch path gives, bit for bit.

For every type it reads (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), crafted blocks (random bytes, sane fp16 scales) and
the benchmark's random blocks go through both: the fp32 weights equal gguf-py's, the int4 groups (codes, in the
CPU kernel's layout or one a byte, and scales and zeros) equal those of the PyTorch path, and fp32 rows laid out
for the int8 kernel multiply as ``int8_matmul.quantize``'s do.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from engine.bench.random_blocks import SCALERS, random_blocks
from engine.chat.chat_template import ChatTemplate
from engine.forward.native import gguf_layout, int8_matmul
from engine.forward.weights import gguf_blocks
from engine.forward.weights.cpu_int4_layout import torch_takes_this_layout
from engine.models.gguf_direct import GGUFState
from engine.models.loading import LoadPlan, load_model
from tests.engine.forward.batch_of_one import prompt_logits
from tests.engine.forward.test_gguf_blocks import crafted_blocks
from tests.engine.models.random_gguf import Shape, write_random_gguf

pytestmark = pytest.mark.skipif(not gguf_layout.available(), reason="no C compiler here")
ROWS, WIDTH = 128, 512


def blocks_of(quant_type: gguf.GGMLQuantizationType) -> list[np.ndarray]:
    crafted = np.concatenate([crafted_blocks(quant_type, seed) for seed in range(ROWS // 32)])  # [128, bytes]
    if quant_type not in SCALERS:
        return [crafted]
    return [crafted, random_blocks(quant_type, ROWS, WIDTH, 0.02, np.random.default_rng(7))]


def without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_layout, "available", lambda: False)
    monkeypatch.setattr(gguf_layout, "takes", lambda *_: False)


@pytest.mark.parametrize("quant_type", gguf_layout.TYPES, ids=lambda t: t.name)
def test_blocks_decode_to_gguf_floats(quant_type):
    for blocks in blocks_of(quant_type):
        assert gguf_layout.takes(blocks, quant_type)
        decoded = gguf_blocks.dense(blocks, quant_type)
        assert np.array_equal(decoded.numpy(), gguf.quants.dequantize(blocks, quant_type))
        rows = blocks[np.array([5, 0, 77])]  # a token table's lookup: a few rows gathered
        assert torch.equal(gguf_blocks.dense(rows, quant_type), decoded[[5, 0, 77]])


@pytest.mark.parametrize("cpu_layout", [True, False], ids=["kernel-layout", "codes"])
@pytest.mark.parametrize("quant_type", gguf_layout.TYPES, ids=lambda t: t.name)
def test_blocks_become_the_same_int4_groups_as_through_pytorch(quant_type, cpu_layout, monkeypatch):
    for blocks in blocks_of(quant_type):
        in_c = gguf_blocks.requantized_groups(blocks, quant_type, cpu_layout)
        with monkeypatch.context() as patched:
            without_c(patched)
            through_torch = gguf_blocks.requantized_groups(blocks, quant_type, cpu_layout)
        assert in_c.in_cpu_layout == (cpu_layout and torch_takes_this_layout())
        assert torch.equal(in_c.q, through_torch.q)
        assert torch.equal(in_c.scales_and_zeros, through_torch.scales_and_zeros.float())
        assert torch.equal(in_c.cpu_packed(1), through_torch.cpu_packed(1))


@pytest.mark.parametrize("quant_type", [Q.Q5_K, Q.Q6_K, Q.Q8_0], ids=lambda t: t.name)
def test_blocks_become_the_same_two_planes_of_int4_groups_as_through_pytorch(quant_type, monkeypatch):
    for blocks in blocks_of(quant_type):
        in_c = gguf_blocks.requantized_pair(blocks, quant_type)
        with monkeypatch.context() as patched:
            without_c(patched)
            through_torch = gguf_blocks.requantized_pair(blocks, quant_type)
        for got, expected in zip(in_c.planes, through_torch.planes, strict=True):
            assert torch.equal(got.q, expected.q) and torch.equal(got.scales_and_zeros, expected.scales_and_zeros)


def test_fp32_rows_take_the_int8_kernels_layout_as_pytorch_lays_them_out(monkeypatch):
    if not int8_matmul.covers(ROWS, WIDTH):
        pytest.skip("Hearth's int8 kernel does not run here")
    weight = torch.randn(ROWS, WIDTH) * 0.05
    weight[3, :32] = 0.0  # a group of zeros: scale 0, codes 0
    weight[9, 40] = 300.0  # one large weight: its group's other codes round to 0
    in_c = int8_matmul.Int8Matmul(weight)
    without_c(monkeypatch)
    through_torch = int8_matmul.Int8Matmul(weight)
    x = torch.randn(3, WIDTH)
    assert in_c.nbytes == through_torch.nbytes and torch.equal(in_c(x), through_torch(x))
    assert torch.equal(in_c(torch.eye(WIDTH)), through_torch(torch.eye(WIDTH)))  # each weight as the kernel reads it


@pytest.mark.parametrize("precision", ["int4", "fp16"])
@pytest.mark.parametrize(("architecture", "layer_type"), [("llama", Q.Q4_K), ("qwen3", Q.Q4_K), ("llama", Q.Q4_0),
                                                          ("qwen2", Q.Q4_1)])
def test_a_layers_matrices_decoded_into_one_weight_answer_as_concatenated_ones(tmp_path, monkeypatch, architecture,
                                                                               layer_type, precision):
    """q, k and v (gate and up) decoded straight into one weight (``GGUFState.stacked``) give the logits their
    concatenation gave, bit for bit: 4-bit layers alone, and an fp16 copy beside them; q/k/v of two types."""
    path = write_random_gguf(tmp_path / "random.gguf", architecture, layer_type,
                             Shape(heads=2, kv_heads=1) if architecture == "qwen3" else Shape())
    stacked = _logits(path, precision)
    monkeypatch.setattr(GGUFState, "stacked", lambda *_: None)
    assert all(torch.equal(got, expected) for got, expected in zip(stacked, _logits(path, precision)))


def _logits(path, precision: str) -> list[torch.Tensor]:
    """The last position's logits of a one-token prompt (the 4-bit weights a decode step reads), then of a long one
    (its fp16 copy, or the 4-bit prompt path), and the weight bytes the load counts."""
    plan = LoadPlan(path, path.stem, torch.device("cpu"), precision, 512, ChatTemplate(None, "test"),
                    four_bit_source=True)
    loaded = load_model(plan, lambda *_: None, lambda: False)
    logits = [prompt_logits(loaded.backend, ids) for ids in ([9], [5, 77, 140, 3, 200, 18, 96, 41] * 20)]
    return logits + [torch.tensor(float(loaded.weight_bytes))]


def test_an_fp16_prompt_copy_packed_on_its_first_call_answers_as_one_packed_at_load(tmp_path, monkeypatch):
    """A 4-bit file's fp16 copy for prompts is packed when a prompt first needs it, not at load: the same weight
    bytes counted, and the same logits for a long prompt after a short one, as when the load packed it."""
    path = write_random_gguf(tmp_path / "random.gguf", "llama", Q.Q4_1)
    on_first_call = _logits(path, "fp16")
    monkeypatch.setattr("engine.forward.weights.quant._packs_on_first_call", lambda *_: False)
    at_load = _logits(path, "fp16")
    assert all(torch.equal(got, expected) for got, expected in zip(on_first_call, at_load))
