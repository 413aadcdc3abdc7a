"""Hearth reads the built-in model as llama.cpp does: teacher-forced next tokens agree (needs llama.cpp: ``peer``).

Over 512 tokens of English text, each position's most likely next token from
Hearth's decode step (the path every reply token takes) is compared with
llama.cpp's (``logits_all``) on the same GGUF file. The mean KL divergence
(llama.cpp's distribution against Hearth's) is printed and recorded.

The 98 % asked for is more than llama.cpp agrees with itself. The same file,
the same tokens, fed to llama.cpp token by token (as its replies are made) instead
of in one 512-token batch: 94.7 % of the next tokens agree, mean KL 0.0044
(measured; flash attention on or off, or f16 or f32 keys and values, move it
between 94 and 96 %). llama.cpp rounds each matmul's activations to 8 bits
(Q8_1), and its batch and one-token paths round in different places; where the
two most likely tokens are nearly tied, the pick then flips. So the test measures Hearth
against that spread: it agrees with llama.cpp's batch run (94-96 %, KL 0.0035) as
closely as llama.cpp's own token-by-token run does, and 99 % of the positions
where llama.cpp's lead is at least ``DECISIVE_LEAD`` agree. A third run settles
which engine rounds more: Hearth at fp32, the file's weights exactly as their
blocks give them and fp32 throughout, which equals transformers' own GGUF load
(top-1 100 %, KL 0 measured). Against it, Hearth's decode path agrees at 98.4 %
(mean KL 0.0001) and llama.cpp at 94.3 % (mean KL 0.0035); all figures are
recorded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.bench.peer import PeerProcess
from engine.forward.native import activation_codes
from engine.models.model_open import open_model
from engine.protocol.messages import LoadOptions
from tests.engine.forward.batch_of_one import OneSequence

pytestmark = pytest.mark.peer
TEXT = Path(__file__).resolve().parents[3] / "README.md"
POSITIONS = 512
SPREAD = 0.02  # of top-1 agreement (and, relative, of KL): llama.cpp's own runs range over 94-96 %
DECISIVE_LEAD = 0.5  # logits between llama.cpp's first and second choice; the median lead is about 0.7


def _hearth_logits(loaded, ids: list[int]) -> np.ndarray:
    """Logits after each of ``ids``, fed one decode step at a time: ``[len(ids), V]``."""
    sequence = OneSequence(loaded.backend, len(ids))
    return np.stack([sequence.feed([token]).float().cpu().numpy() for token in ids])


def _mean_kl(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean over positions of KL(softmax(reference) ‖ softmax(other)), in float64."""
    log_p = _log_softmax(reference.astype(np.float64))  # [T, V]
    log_q = _log_softmax(other.astype(np.float64))
    return float((np.exp(log_p) * (log_p - log_q)).sum(axis=-1).mean())


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _open(path, precision: str):
    return open_model(str(path), LoadOptions("cpu", precision), lambda _: None, lambda *_: None, lambda: False)


def _agreement(logits: np.ndarray, other: np.ndarray) -> float:
    return float((logits.argmax(-1) == other.argmax(-1)).mean())


@pytest.fixture(scope="module")
def text_ids(default_model_path) -> list[int]:
    ids = _open(default_model_path, "fp32").tokenize(TEXT.read_text())[:POSITIONS]
    assert len(ids) == POSITIONS
    return ids


@pytest.fixture(scope="module")
def exact(default_model_path, text_ids) -> np.ndarray:
    """Hearth at fp32: the file's weights exactly as their blocks give them, fp32 throughout, [T, V]."""
    return _hearth_logits(_open(default_model_path, "fp32"), text_ids)


@pytest.fixture(scope="module")
def peer_runs(default_model_path, text_ids) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's logits after each token, [T, V]: fed in one batch, and token by token."""
    with PeerProcess(default_model_path, threads=2, n_ctx=POSITIONS + 8) as llama:
        return llama.logits(text_ids), llama.logits(text_ids, chunk=1)


@pytest.fixture(scope="module")
def reference(peer_runs) -> np.ndarray:
    return peer_runs[0]


def test_top_1_next_tokens_agree_with_llama_cpp(default_model_path, text_ids, exact, peer_runs, record_property):
    reference, token_by_token = peer_runs
    loaded = _open(default_model_path, "auto")
    hearth = _hearth_logits(loaded, text_ids)  # [T, V]

    same = hearth.argmax(-1) == reference.argmax(-1)  # [T]
    ranked = np.sort(reference, axis=-1)  # [T, V]
    decisive = ranked[:, -1] - ranked[:, -2] >= DECISIVE_LEAD  # [T]
    agreement, decisive_agreement = float(same.mean()), float(same[decisive].mean())
    kl = _mean_kl(reference, hearth)
    print(f"top-1 agreement {agreement:.4f} ({decisive_agreement:.4f} at {decisive.sum()} decisive positions), "
          f"mean KL {kl:.5f} over {POSITIONS} positions ({loaded.precision_label})")
    record_property("top1_agreement", agreement)
    record_property("top1_agreement_decisive", decisive_agreement)
    record_property("mean_kl", kl)
    itself = (_agreement(token_by_token, reference), _mean_kl(reference, token_by_token))
    print(f"llama.cpp token by token against its batch run: top-1 {itself[0]:.4f}, mean KL {itself[1]:.5f}")
    record_property("llama_cpp_to_itself", itself)
    to_exact = {"hearth": (_agreement(hearth, exact), _mean_kl(exact, hearth)),
                "llama_cpp": (_agreement(reference, exact), _mean_kl(exact, reference))}
    print("against fp32 on the exact weights: " + ", ".join(
        f"{name} top-1 {agree:.4f}, mean KL {divergence:.5f}" for name, (agree, divergence) in to_exact.items()))
    record_property("to_exact", to_exact)
    assert reference.shape == hearth.shape and decisive.mean() > 0.5
    assert decisive_agreement >= 0.99
    assert agreement >= itself[0] - SPREAD and kl <= itself[1] * (1 + SPREAD)
    assert to_exact["hearth"][0] >= 0.98 and to_exact["hearth"][1] <= to_exact["llama_cpp"][1]


def test_4bit_alone_stays_as_close_to_the_exact_weights_as_llama_cpp(default_model_path, text_ids, exact, reference,
                                                                      record_property):
    """4 bits alone (what an 8B file gets on a 16 GB machine): the output layer in int8 groups (two planes of 4-bit
    groups without Hearth's kernels), the token table in the file's blocks. With the output layer in one plane of
    4-bit groups it agreed at about 80 %."""
    four_bit = _hearth_logits(_open(default_model_path, "int4"), text_ids)  # [T, V]
    _assert_as_close_to_exact_as_llama_cpp(four_bit, exact, reference, "4-bit alone", record_property)


def test_a_batched_steps_rounding_stays_as_close_to_the_exact_weights_as_llama_cpp(default_model_path, text_ids,
                                                                                   exact, reference,
                                                                                   record_property, monkeypatch):
    """A step over several sequences rounds each layer's activations to one int8 code (``activation_codes``), as
    llama.cpp does, and the output layer's to two: measured 96.9 % top-1, mean KL 0.0023, against llama.cpp's 95.9 %,
    0.0032. Each decode step here is rounded as a step over 8 sequences."""
    loaded = _open(default_model_path, "auto")
    as_a_step = activation_codes.for_step
    monkeypatch.setattr(activation_codes, "for_step", lambda sequences: as_a_step(8))
    batched = _hearth_logits(loaded, text_ids)  # [T, V]
    _assert_as_close_to_exact_as_llama_cpp(batched, exact, reference, "a batched step's rounding", record_property)


def _assert_as_close_to_exact_as_llama_cpp(hearth: np.ndarray, exact: np.ndarray, reference: np.ndarray, label: str,
                                           record_property) -> None:
    """Hearth's logits [T, V] agree with fp32 on the exact weights at least as often as llama.cpp's, and diverge no
    more; both recorded under ``label``."""
    ours = (_agreement(hearth, exact), _mean_kl(exact, hearth))
    theirs = (_agreement(reference, exact), _mean_kl(exact, reference))
    print(f"against fp32 on the exact weights: {label} top-1 {ours[0]:.4f}, mean KL {ours[1]:.5f}; "
          f"llama.cpp top-1 {theirs[0]:.4f}, mean KL {theirs[1]:.5f}")
    record_property(f"{label} to exact", ours)
    assert ours[0] >= theirs[0] and ours[1] <= theirs[1]
