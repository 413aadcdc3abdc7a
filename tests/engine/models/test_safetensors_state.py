"""Safetensors folders load tensor by tensor into the fast path.

They answer with transformers' own greedy tokens, sharded folders load the same, a cancel stops the
reading between two tensors, a bf16 folder never has its whole state (or an fp32 copy of it) alive
while it loads, and the memory estimate is what the load holds.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch

from engine.forward.weights.pack_worker import PENDING
from engine.chat.chat_template import ChatTemplate
from engine.models.loading import LoadCancelled, LoadPlan, load_model
from engine.models.memory_estimate import estimate
from engine.models.model_files import folder_weights, inspect_model
from engine.models.safetensors_state import SafetensorsState
from tests.engine.forward.batch_of_one import greedy_tokens

CPU = torch.device("cpu")
PROMPT = [5, 77, 140, 3, 200, 18, 96, 41]
NEW_TOKENS = 12
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def _folder(tiny_model_dir: Path, target: Path, dtype: torch.dtype, shard_size: str | None = None) -> Path:
    """The session's tiny Llama saved again in ``dtype`` (sharded when ``shard_size`` is given), with its tokenizer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=dtype)
    model.save_pretrained(target, **({"max_shard_size": shard_size} if shard_size else {}))
    for name in TOKENIZER_FILES:
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, target / name)
    return target


def _load(folder: Path, precision: str, progress=lambda *_: None, is_cancelled=lambda: False):
    plan = LoadPlan(folder, folder.name, CPU, precision, 256, ChatTemplate(None, "test"))
    return load_model(plan, progress, is_cancelled)


def _greedy(loaded) -> list[int]:
    return greedy_tokens(loaded.backend, PROMPT, NEW_TOKENS)


def _hf_greedy(folder: Path) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT):]


def test_a_folder_answers_with_transformers_greedy_tokens_and_a_sharded_one_alike(tiny_model_dir, tmp_path):
    sharded = _folder(tiny_model_dir, tmp_path / "sharded", torch.float32, shard_size="100KB")
    assert len(list(sharded.glob("*.safetensors"))) > 2 and (sharded / "model.safetensors.index.json").is_file()
    expected = _hf_greedy(tiny_model_dir)
    assert len(set(expected)) > 3  # the reply varies, so a wrong weight would show
    single, split = _load(tiny_model_dir, "fp32"), _load(sharded, "fp32")
    assert type(single.backend).__name__ == "FastLlamaBackend"
    assert _greedy(single) == expected
    assert _greedy(split) == expected


def test_tensors_are_read_only_when_asked_for_and_counted(tiny_model_dir):
    from safetensors import safe_open

    reports = []
    state = SafetensorsState(tiny_model_dir, lambda done, total: reports.append((done, total)))
    name = "model.layers.1.mlp.down_proj.weight"
    assert reports == [] and name in state and len(state) == len(list(state))
    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as handle:
        assert torch.equal(state[name], handle.get_tensor(name))
    assert reports == [(1, len(state))]


def test_cancelling_mid_load_stops_reading_tensors(tiny_model_dir):
    reports = []
    with pytest.raises(LoadCancelled):
        _load(tiny_model_dir, "fp16", lambda done, total: reports.append(done), lambda: len(reports) >= 3)
    assert reports == [1, 2, 3]  # the fourth tensor's report raised: nothing was read after it


def _live_bytes(dtype: torch.dtype, before: set[int]) -> int:
    """Bytes of the distinct storages of the ``dtype`` CPU tensors alive now that were not alive ``before``."""
    storages = {}
    for thing in gc.get_objects():
        if type(thing) is torch.Tensor and thing.dtype == dtype and id(thing) not in before:
            storage = thing.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def test_a_bf16_folder_loads_one_tensor_at_a_time_without_an_fp32_copy_of_its_state(tiny_model_dir, tmp_path):
    folder = _folder(tiny_model_dir, tmp_path / "bf16", torch.bfloat16)
    source = inspect_model(folder)
    sizes = [entry.end - entry.begin for header in folder_weights(folder)[0] for entry in header.tensors]  # bytes
    assert sum(sizes) > 4 * max(sizes)  # a whole state would show against one tensor's bound
    before = {id(thing) for thing in gc.get_objects() if type(thing) is torch.Tensor}
    alive = []
    progress = lambda *_: alive.append((_live_bytes(torch.bfloat16, before), _live_bytes(torch.float32, before)))
    loaded = _load(folder, "fp16", progress)
    assert len(alive) == len(sizes) and source.n_params * 2 == sum(sizes)
    assert max(bf16 for bf16, _ in alive) <= max(sizes)  # the tensor just read, nothing before it
    # in fp32 at most the tensor being folded and those waiting for the pack worker (``pack_worker.PENDING``), which
    # lag behind by as much as the machine's load makes them: never the whole state's fp32 copy
    assert max(fp32 for _, fp32 in alive) <= (PENDING + 1) * 2 * max(sizes) < 2 * sum(sizes)
    assert loaded.precision == "fp16"


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int4"])
def test_the_estimate_is_what_the_cpu_load_holds(tiny_model_dir, precision):
    found = estimate(inspect_model(tiny_model_dir), precision, 256, "cpu")
    loaded = _load(tiny_model_dir, precision)
    assert abs(found.weight_bytes - loaded.weight_bytes) <= 0.1 * loaded.weight_bytes
