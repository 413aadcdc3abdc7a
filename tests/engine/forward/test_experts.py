"""Qwen2-MoE and Qwen3-MoE in the fast path answer as transformers' own forward does.

Tiny random models of both kinds (``moe_gguf.tiny_moe``: 8 experts, 2 active, a dense layer among the mixtures;
Qwen2-MoE's shared expert), from a safetensors folder and from a GGUF file in llama.cpp's layout, in fp32 and from
4-bit blocks; several sequences joining a batch at different steps; and a step's rows grouped by expert.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from engine.chat.chat_template import ChatTemplate
from engine.chat.speculative.draft_length import ROW_COST
from engine.forward.experts import MixtureOfExperts
from engine.forward.paged_kv import BatchRow
from engine.models.loading import LoadPlan, load_model, wrap_model
from engine.models.random_models import byte_tokenizer
from engine.service.batch_runner import BatchRunner
from engine.service.draft_model import drafted_row_cost
from tests.engine.forward.batch_of_one import OneSequence, greedy_tokens, prompt_logits
from tests.engine.models.moe_gguf import tiny_moe, write_moe_gguf

CPU = torch.device("cpu")
KINDS = ("qwen3_moe", "qwen2_moe")
PROMPT = [5, 77, 140, 3, 200, 18, 96, 41, 9, 250, 33, 64]


def _load(path: Path, precision: str, four_bit_source: bool = False):
    plan = LoadPlan(path, path.stem, CPU, precision, 512, ChatTemplate(None, "test"), four_bit_source=four_bit_source)
    return load_model(plan, lambda *_: None, lambda: False)


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [S, V]


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(kind: str, tmp_path_factory: pytest.TempPathFactory):
    """A random model saved as transformers saves it, and the model."""
    model = tiny_moe(kind)
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path, model


def _every_layer_kind(loaded) -> set[str]:
    return {type(layer.mlp).__name__ for layer in loaded.model.layers}


def test_fp32_from_a_safetensors_folder_equals_transformers(folder):
    path, model = folder
    loaded = _load(path, "fp32")
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    assert _every_layer_kind(loaded) == {"GatedMlp", "MixtureOfExperts"}
    torch.testing.assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT)[-1],
                               atol=1e-4, rtol=1e-4)


def test_fp32_from_transformers_stacked_experts_equals_its_forward(folder):
    """transformers' own model holds each layer's experts stacked (``mlp.experts.gate_up_proj`` [E, 2F, D])."""
    _, model = folder
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in model.state_dict())
    plan = LoadPlan(Path("random"), "random", CPU, "fp32", 512, ChatTemplate(None, "test"))
    loaded = wrap_model(model, byte_tokenizer(), plan, 0.0)
    assert _every_layer_kind(loaded) == {"GatedMlp", "MixtureOfExperts"}
    torch.testing.assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT)[-1],
                               atol=1e-4, rtol=1e-4)


def test_fp32_from_a_gguf_file_equals_transformers(kind: str, tmp_path: Path):
    model = tiny_moe(kind)
    loaded = _load(write_moe_gguf(tmp_path / f"{kind}.gguf", model), "fp32")
    assert loaded.model.config.model_type == kind
    assert _every_layer_kind(loaded) == {"GatedMlp", "MixtureOfExperts"}
    torch.testing.assert_close(prompt_logits(loaded.backend, PROMPT), _hf_logits(model, PROMPT)[-1],
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("precision", ["int4", "fp16"])
def test_4bit_blocks_pick_the_dequantized_models_greedy_tokens(kind: str, precision: str, tmp_path: Path):
    """The experts stay in the file's 4-bit groups, beside 4-bit layers or fp16 ones with a 4-bit decode copy;
    against transformers over the weights those blocks stand for, teacher-forced along the reference's own greedy
    reply (a bf16 rounding that flips one routing choice must not send the rest of the comparison down another
    reply)."""
    model = tiny_moe(kind)
    loaded = _load(write_moe_gguf(tmp_path / f"{kind}-q4_0.gguf", model, Q.Q4_0), precision, four_bit_source=True)
    expert = next(layer.mlp for layer in loaded.model.layers if isinstance(layer.mlp, MixtureOfExperts)).experts[0]
    assert expert.gate_up.fmt == "int4" and expert.down.fmt == "int4"
    reply = model.generate(torch.tensor([PROMPT]), max_new_tokens=40, min_new_tokens=40, do_sample=False)[0].tolist()
    expected = _hf_logits(model, reply)[len(PROMPT) - 1 : -1]  # [40, V]
    sequence = OneSequence(loaded.backend, len(reply))
    got = torch.stack([sequence.feed(PROMPT)] + [sequence.feed([token]) for token in reply[len(PROMPT) : -1]])
    agreeing = (got.argmax(dim=1) == expected.argmax(dim=1)).float().mean()
    assert agreeing >= 0.9
    assert torch.nn.functional.cosine_similarity(got, expected, dim=1).mean() > 0.99


def test_batched_greedy_equals_each_sequence_alone(folder):
    """Three sequences of different prompt lengths, joining the batch at steps 0, 2 and 5, each decoding 12 tokens:
    the batch's rows mix prompts with decode rows, and its experts serve rows of several sequences at once."""
    path, _ = folder
    backend = _load(path, "fp32").backend
    prompts = {0: PROMPT[:3], 2: PROMPT, 5: PROMPT[2:9]}
    count = 12
    pool = OneSequence(backend, capacity=64 * 16).kv  # one pool, each sequence in blocks of its own
    sequences = []  # [start block, length, tokens]
    for step in range(5 + count):
        rows, active = [], []
        for start, prompt in prompts.items():
            if start == step:
                sequences.append([len(sequences) * 16, 0, list(prompt), len(prompt)])
        for sequence in sequences:
            first_block, length, tokens, prompt_length = sequence
            if len(tokens) - prompt_length >= count:
                continue
            new = tokens[length:]
            blocks = list(range(first_block, first_block + 16))
            rows.append(BatchRow(new, length, blocks))
            active.append(sequence)
        if not rows:
            continue
        logits = backend.forward_batch(rows, pool)
        for sequence, row_logits in zip(active, logits):
            sequence[1] = len(sequence[2])
            sequence[2].append(int(row_logits.argmax()))
    for (_, _, tokens, prompt_length), prompt in zip(sequences, prompts.values()):
        assert tokens[prompt_length:] == greedy_tokens(backend, prompt, count)


def test_a_drafted_row_of_a_mixture_costs_its_own_experts_reads(folder):
    """A drafted token's row routes to experts of its own: prompt lookup charges them, so drafts that do not pay
    pause sooner than in a dense model."""
    loaded = _load(folder[0], "fp32")
    routed = sum(layer.mlp.routed_row_nbytes for layer in loaded.model.layers
                 if isinstance(layer.mlp, MixtureOfExperts))  # each mixture's top k experts of one row
    expected = ROW_COST + routed / loaded.model.decode_bytes
    assert routed > 0 and drafted_row_cost(loaded) == pytest.approx(expected)
    runner = BatchRunner(loaded, lambda event: None, lambda request_id: False)
    assert runner._draft_source().row_cost == pytest.approx(expected)


class _Counted:
    """An expert that records the rows of each call and returns them times its number."""

    def __init__(self, number: int, calls: list[tuple[int, int]]) -> None:
        self.number, self.calls = number, calls

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.number, h.shape[0]))
        return h * self.number


def test_a_step_calls_each_chosen_expert_once_over_all_its_rows():
    width, experts = 4, 6
    router = torch.zeros(experts, width)
    router[1, 0] = router[4, 1] = router[2, 2] = 10.0  # row i picks by its hot column: 0 -> 1, 1 -> 4, 2 -> 2
    rows = torch.eye(width)[[0, 1, 0, 2, 1]] * 1.0  # [5, D]
    calls: list[tuple[int, int]] = []
    moe = MixtureOfExperts(torch.ones(width), router, [_Counted(i, calls) for i in range(experts)], top_k=1,
                           normalise_top_k=True)
    out = moe(rows)
    assert sorted(calls) == [(1, 2), (2, 1), (4, 2)]  # the three chosen experts, each once, no other touched
    torch.testing.assert_close(out, rows * torch.tensor([1.0, 4, 1, 2, 4]).unsqueeze(1))


def test_the_shared_expert_adds_its_output_scaled_by_its_gates_sigmoid():
    width = 4
    router = torch.zeros(3, width)  # two experts, then the shared gate's row
    router[2] = torch.tensor([1.0, 0, 0, 0])
    calls: list[tuple[int, int]] = []
    moe = MixtureOfExperts(torch.ones(width), router, [_Counted(i, calls) for i in (2, 3)], top_k=2,
                           normalise_top_k=False, shared=_Counted(5, calls))
    row = torch.tensor([[2.0, 0, 0, 0]])
    # equal logits: each routed expert weighs 1/2; the shared one sigmoid(2)
    expected = row * (0.5 * 2 + 0.5 * 3) + torch.sigmoid(torch.tensor(2.0)) * row * 5
    torch.testing.assert_close(moe(row), expected)
