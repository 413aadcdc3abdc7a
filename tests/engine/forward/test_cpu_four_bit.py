"""The built-in Q4_1 model on the CPU: fp16 with a 4-bit decode copy (auto), or 4-bit alone; both answer right.

Weight bytes count the token table and the output layer (the table in the file's blocks, the output layer in
fp16, or beside 4-bit layers alone in two planes of 4-bit groups) and the layers' matmuls; the estimate the load
dialog shows is what the load holds. 4-bit alone predicts the next tokens of a text as fp32 does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.bench.measure import timed_reply
from engine.bench.runner_replies import ReplyDriver
from engine.forward.native import int4_scales
from engine.forward.native import int4_matmul as native_int4
from engine.forward.native import int8_matmul as native_int8
from engine.models import memory_estimate
from engine.models.model_files import inspect_model
from engine.models.model_open import open_model
from engine.chat.chat_template import ChatTemplate
from engine.models.format_plan import fast_formats, formats_for_source, this_host, traits_of
from engine.models.loading import LoadPlan, load_model
from engine.protocol.messages import ChatMessage, LoadOptions
from tests.engine.forward.batch_of_one import OneSequence

CPU = torch.device("cpu")
QUESTION = [ChatMessage("user", "What is the capital of France? Answer in one word.")]


def _open(path: Path, precision: str):
    return open_model(str(path), LoadOptions("cpu", precision), lambda _: None, lambda *_: None, lambda: False)


FOUR_BIT = 0.5 + 4 / 32  # bytes per weight as PyTorch's kernel takes them: a bf16 scale and zero point per 32


def _four_bit_layer_bytes(config) -> float:
    """The layers in 4 bits: on Hearth's kernels each block of 64 rows keeps its scales as ``int4_scales`` lays them
    out (SmolLM2's widths 576 and 1536: 18 and 48 groups), else PyTorch's bf16 pairs."""
    if not native_int4.covers(64, config.hidden_size, 32):
        return _layer_weights(config) * FOUR_BIT
    def per_weight(width: int) -> float:
        return 0.5 + int4_scales.block_bytes(width // 32) / (64 * width)
    hidden, inner, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    attention = hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    return config.num_hidden_layers * ((attention + 2 * hidden * inner) * per_weight(hidden)
                                       + hidden * inner * per_weight(inner))
TEXT = Path(__file__).resolve().parents[3] / "README.md"


def _table_bytes(config) -> int:
    """The token table in the file's Q8_0 blocks: 34 bytes per 32 weights."""
    return config.vocab_size * config.hidden_size // 32 * 34


def _table_and_head_bytes(config, beside_four_bit: bool) -> int:
    """The token table, and the output layer: beside 4-bit layers (a decode copy, or alone) in int8 groups of 32
    where Hearth's kernel runs (a byte a weight, an fp16 scale a group), the tied table looked up in those; else
    the table in the file's blocks beside the output layer in fp16 as FBGEMM packs it, its width 576 padded to
    1024."""
    weights = config.vocab_size * config.hidden_size
    if beside_four_bit and native_int8.covers(config.vocab_size, config.hidden_size):
        return weights * (1 + 2 / 32)
    return _table_bytes(config) + 2 * config.vocab_size * 1024


def _layer_weights(config) -> int:
    """Weights of the attention and MLP matmuls of every layer."""
    hidden, inner, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    attention = hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    return config.num_hidden_layers * (attention + 3 * hidden * inner)


def _fp16_layer_bytes(config, beside_a_decode_copy: bool) -> int:
    """The layers' fp16 matrices: SmolLM2's width 576 in FBGEMM's blocks, padded to 1024, but gate/up's 3072 rows
    where only prompts use them (beside the 4-bit copy) as 512 fp16 columns and 64 in fp32; the MLP's 1536 in whole
    blocks."""
    hidden, inner, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    qkv_rows = head_dim * (config.num_attention_heads + 2 * config.num_key_value_heads)
    padded_rows = qkv_rows + config.num_attention_heads * head_dim  # q/k/v and out: width 576
    gate_up_bytes = 2 * inner * (2 * 512 + 4 * 64 if beside_a_decode_copy else 2 * 1024)
    return config.num_hidden_layers * (padded_rows * 2 * 1024 + gate_up_bytes + 2 * hidden * inner)


def _answer(loaded) -> str:
    return timed_reply(loaded, ReplyDriver(loaded, 512), QUESTION, 24).text


@pytest.fixture(scope="module")
def fp32_answer(default_model_path: Path) -> str:
    return _answer(_open(default_model_path, "fp32"))


def test_auto_keeps_a_4bit_copy_for_decoding_and_answers_as_fp32_does(default_model_path: Path, fp32_answer: str,
                                                                      without_prompt_kernels: None):
    auto = _open(default_model_path, "auto")
    config = auto.model.config
    assert auto.precision == "fp16"
    assert auto.precision_label == "fp16 weights, int4 copy for decoding"  # what the window shows
    layers = _fp16_layer_bytes(config, beside_a_decode_copy=True) + _four_bit_layer_bytes(config)
    assert auto.weight_bytes == layers + _table_and_head_bytes(config, beside_four_bit=True)
    assert "Paris" in fp32_answer
    assert _answer(auto) == fp32_answer


def test_a_plan_without_the_decode_copy_loads_fp16_alone(default_model_path: Path):
    source = inspect_model(default_model_path)
    formats = fast_formats("cpu", "fp16", traits_of(source), this_host())
    plan = LoadPlan(source.path, source.name, CPU, "fp16", 512, ChatTemplate(None, "test"), formats=formats)
    fp16_only = load_model(plan, lambda *_: None, lambda: False)
    config = fp16_only.model.config
    assert fp16_only.precision_label == "fp16 weights"
    assert fp16_only.weight_bytes == (_fp16_layer_bytes(config, beside_a_decode_copy=False)
                                      + _table_and_head_bytes(config, beside_four_bit=False))


def test_4bit_alone_holds_everything_in_a_third_of_fp16s_bytes_and_answers_paris(default_model_path: Path):
    four_bit = _open(default_model_path, "int4")
    config = four_bit.model.config
    assert four_bit.precision == "int4"
    if native_int8.covers(config.vocab_size, config.hidden_size):
        table_and_head = _table_and_head_bytes(config, beside_four_bit=True)
    else:
        table_and_head = _table_bytes(config) + 2 * config.vocab_size * config.hidden_size * FOUR_BIT  # two planes
    assert four_bit.weight_bytes == _four_bit_layer_bytes(config) + table_and_head
    assert "Paris" in _answer(four_bit)


def test_nf4_from_an_earlier_version_loads_the_int4_weights(default_model_path: Path):
    """A request or command line of an earlier version names the fast path's 4 bits "nf4"."""
    loaded = _open(default_model_path, "nf4")
    assert loaded.formats == formats_for_source(inspect_model(default_model_path), "cpu", "int4")
    assert loaded.precision_label == "int4 weights"


def _next_token_picks(loaded, ids: list[int]) -> torch.Tensor:
    """The most likely next token after each of ``ids``, fed one decode step at a time: [len(ids)]."""
    sequence = OneSequence(loaded.backend, len(ids))
    return torch.stack([sequence.feed([token]).argmax() for token in ids])


def test_4bit_alone_predicts_the_next_tokens_of_a_text_as_fp32_does(default_model_path: Path, kernel_variant: str):
    """Teacher-forced over 256 tokens of English, on each variant of Hearth's kernels. With the output layer in 4
    bits (one plane) 79 % agreed; with two planes and the file's token table 97 %."""
    exact, four_bit = _open(default_model_path, "fp32"), _open(default_model_path, "int4")
    ids = exact.tokenize(TEXT.read_text())[:256]
    agreement = (_next_token_picks(four_bit, ids) == _next_token_picks(exact, ids)).float().mean().item()
    assert agreement >= 0.95


@pytest.mark.parametrize("precision", ["fp16", "int4", "fp32"])
def test_the_estimate_is_what_the_load_holds(default_model_path: Path, precision: str):
    """The load dialog's estimate counts the formats the load then uses, and the bytes it then holds."""
    from engine.models.memory_estimate import estimate

    source = inspect_model(default_model_path)
    loaded = _open(default_model_path, precision)
    assert loaded.formats == formats_for_source(source, "cpu", precision)
    estimated = estimate(source, precision, 2048, "cpu").weight_bytes
    assert abs(estimated - loaded.weight_bytes) <= 0.01 * loaded.weight_bytes


@pytest.mark.parametrize("amx, prompt_kernel, note", [
    (True, False, "int4 prompts run faster here"), (False, True, "int4 prompts run faster here"),
    (False, False, "fp16 did not fit"),
])
def test_the_window_says_why_auto_ran_4bit_alone(default_model_path: Path, monkeypatch: pytest.MonkeyPatch, amx: bool,
                                                 prompt_kernel: bool, note: str, host_features):
    """With AMX's bf16 tiles or Hearth's int4 prompt kernel auto keeps the 4-bit weights alone for speed; without,
    only where fp16 would not fit comfortably (here: too little free memory), and the precision shown gives the
    reason that applied."""
    host_features(amx_tiles=amx, prompt_kernel=prompt_kernel, native_kernels=True)
    if note == "fp16 did not fit":
        fp16 = memory_estimate.estimate(inspect_model(default_model_path), "fp16", 8192, "cpu").total_bytes
        monkeypatch.setattr(memory_estimate, "available_memory", lambda _device: int(fp16 / 0.95))
    loaded = _open(default_model_path, "auto")
    assert loaded.precision == "int4"
    assert loaded.precision_label.endswith(f"({note})")
