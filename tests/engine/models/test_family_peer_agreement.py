"""Each family's GGUF files are read as llama.cpp reads them: teacher-forced next tokens agree (``peer``).

Random weights in each family's real per-layer shape, cut to its first two layers
(``engine.bench.random_gguf``), written as ``llama-quantize`` lays the type out.
Over the same token ids, each position's most likely next token from Hearth's decode
step (``auto``: the path every reply token takes) is compared with llama.cpp's at the
positions where llama.cpp's choice is clear: its lead over the second choice in the
upper half of the positions' leads. Random weights give flat distributions, so a
fixed lead (as for the built-in model) would leave few positions; a family step
missing or misread (a norm, a multiplier, a row order) leaves next to no agreement.

gpt-oss's cut takes its experts' int8 kernel and the int8 copy of its Q8_0 attention, as a decode step does.

Phi-4-mini is written in Q4_0: in Q4_K_M its fused q/k/v is Q5_K, which the 4-bit decode
copy requantizes, and that rounding (not the reading of the family) moves 2 of 24 clear
positions (fp32 from the same file agrees at all 24).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.bench.peer import PeerProcess
from engine.bench.random_gguf import write_random_gguf
from engine.models.model_open import open_model
from engine.protocol.messages import LoadOptions
from tests.engine.forward.batch_of_one import OneSequence

pytestmark = pytest.mark.peer
FILES = (("gemma3-1b@2", "q4_k_m"), ("phi4-mini@2", "q4_0"), ("granite3.1-2b@2", "q4_k_m"),
         ("qwen3-30b-a3b@2", "q4_k_m"), ("gpt-oss-20b@2", "mxfp4_moe"))
POSITIONS = 48
CONTEXT = POSITIONS + 8
AGREEMENT = 0.95


def _hearth_logits(path: Path, ids: list[int]) -> np.ndarray:
    """Logits after each of ``ids``, fed one decode step at a time: ``[len(ids), V]``."""
    options = LoadOptions("cpu", "auto", CONTEXT)  # llama.cpp's: within Phi's trained 4 096, its short factors
    loaded = open_model(str(path), options, lambda _: None, lambda *_: None, lambda: False)
    assert type(loaded.backend).__name__ == "FastLlamaBackend"
    sequence = OneSequence(loaded.backend, len(ids))
    return np.stack([sequence.feed([token]).float().cpu().numpy() for token in ids])


@pytest.mark.parametrize("shape, file_type", FILES)
def test_top_1_next_tokens_agree_with_llama_cpp(tmp_path: Path, default_model_path: Path, shape: str, file_type: str):
    path = tmp_path / f"{shape}.gguf"
    write_random_gguf(path, shape, file_type, default_model_path)
    ids = np.random.default_rng(0).integers(100, 40_000, POSITIONS).tolist()
    with PeerProcess(path, threads=2, n_ctx=CONTEXT) as llama:
        reference = llama.logits(ids, chunk=1)  # [T, V]
    hearth = _hearth_logits(path, ids)  # [T, V]

    ranked = np.sort(reference, axis=-1)
    lead = ranked[:, -1] - ranked[:, -2]  # [T]
    clear = lead >= np.median(lead)
    agreement = float((hearth.argmax(-1) == reference.argmax(-1))[clear].mean())
    print(f"{shape}: top-1 agreement {agreement:.3f} at {clear.sum()} clear positions")
    assert agreement >= AGREEMENT
