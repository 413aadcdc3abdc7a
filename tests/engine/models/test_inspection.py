"""InspectModel: what the load dialog learns about a model before loading it (no Qt)."""

from __future__ import annotations

import math
import queue
from pathlib import Path

import pytest

from engine.models.inspection import inspect_for_dialog, inspect_request
from engine.protocol.channels import CancelWatch
from engine.protocol.messages import InspectFailed, InspectModel, LoadOptions, ModelInspected
from engine.service.runtime import ModelRuntime

PLENTY = 64 * 1024**3
# The tiny model: 2 layers × 2 KV heads × head size 16, trained for 1024 tokens.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # bf16 on the CPU fast path, but beside fp32 weights (twice that)


def _plenty(_device: str) -> int:
    return PLENTY


def _by_precision(found: ModelInspected) -> dict[str, object]:
    return {item.precision: item for item in found.estimates}


def test_a_folder_is_described_with_an_estimate_per_cpu_precision(tiny_model_dir: Path):
    found = inspect_for_dialog(str(tiny_model_dir), LoadOptions(device="cpu"), "r1", _plenty, cuda_available=False)

    assert (found.request_id, found.name, found.kind, found.device) == ("r1", tiny_model_dir.name, "hf_folder", "cpu")
    assert found.native_context_length == found.context_length == 1024
    assert found.n_params > 0
    estimates = _by_precision(found)
    assert list(estimates) == ["fp32", "bf16", "fp16", "int8", "int4"]
    assert estimates["int4"].weight_bytes < estimates["int8"].weight_bytes < estimates["fp16"].weight_bytes
    assert estimates["fp16"].kv_bytes == KV_BYTES_PER_TOKEN * 1024
    assert estimates["fp32"].kv_bytes == 2 * KV_BYTES_PER_TOKEN * 1024
    assert estimates["bf16"].weight_bytes == found.n_params * 2
    assert {item.verdict for item in found.estimates} == {"fits"}
    assert found.auto_precision == "fp16"  # a Llama folder: the CPU fast path holds fp16 weights
    assert (found.cuda_available, found.available_bytes_cpu, found.available_bytes_cuda) == (False, PLENTY, 0)


def test_the_kv_cache_grows_with_the_chosen_context_length(tiny_model_dir: Path):
    options = LoadOptions(device="cpu", context_length=1024)
    found = inspect_for_dialog(str(tiny_model_dir), options, "r2", _plenty, cuda_available=False)

    assert found.context_length == 1024
    assert _by_precision(found)["fp16"].kv_bytes == KV_BYTES_PER_TOKEN * 1024


def test_auto_takes_the_smaller_precision_when_only_it_fits(tiny_model_dir: Path):
    roomy = inspect_for_dialog(str(tiny_model_dir), LoadOptions(device="cpu"), "r3", _plenty, cuda_available=False)
    int4_total = _by_precision(roomy)["int4"].total_bytes
    just_enough = math.ceil(int4_total / 0.85)

    found = inspect_for_dialog(str(tiny_model_dir), LoadOptions(device="cpu"), "r3", lambda _d: just_enough, False)

    verdicts = {item.precision: item.verdict for item in found.estimates}
    assert verdicts["int4"] == "fits"
    assert verdicts["fp16"] != "fits"
    assert found.auto_precision == "int4"


def test_nothing_fits_in_a_few_kilobytes(tiny_model_dir: Path):
    found = inspect_for_dialog(str(tiny_model_dir), LoadOptions(), "r4", lambda _d: 4096, cuda_available=False)

    assert {item.verdict for item in found.estimates} == {"won't fit"}
    assert found.auto_precision is None


def test_on_cuda_the_quantized_precisions_are_estimated_against_gpu_memory(tiny_model_dir: Path):
    free = {"cpu": PLENTY, "cuda": 8 * 1024**3}
    found = inspect_for_dialog(str(tiny_model_dir), LoadOptions(), "r5", free.__getitem__, cuda_available=True)

    assert found.device == "cuda"
    assert [item.precision for item in found.estimates] == ["bf16", "fp16", "fp32", "int8", "int4"]
    assert found.available_bytes_cuda == 8 * 1024**3
    assert found.auto_precision == "bf16"
    estimates = _by_precision(found)
    assert estimates["int4"].weight_bytes < estimates["int8"].weight_bytes < estimates["bf16"].weight_bytes


def test_a_missing_path_is_refused_with_its_reason(tmp_path: Path):
    answer = inspect_request(InspectModel("r6", str(tmp_path / "nowhere.gguf")))

    assert isinstance(answer, InspectFailed)
    assert answer.request_id == "r6"
    assert "does not exist" in answer.message


def test_the_runtime_answers_inspect_model_with_model_inspected(tiny_model_dir: Path):
    events: list[object] = []
    runtime = ModelRuntime(events.append, CancelWatch(queue.Queue()))

    runtime.handle(InspectModel("r7", str(tiny_model_dir), LoadOptions(device="cpu", context_length=128)))

    assert len(events) == 1
    assert isinstance(events[0], ModelInspected)
    assert (events[0].request_id, events[0].context_length) == ("r7", 128)


def test_a_draft_model_is_counted_beside_the_model_as_its_load_holds_it(tiny_model_dir: Path):
    from engine.models.model_open import open_model
    from engine.scheduler.block_pool import BLOCK_SIZE
    from engine.service.draft_model import ModelDrafts

    alone = inspect_for_dialog(str(tiny_model_dir), LoadOptions(device="cpu"), "r8", _plenty, cuda_available=False)
    options = LoadOptions(device="cpu", draft_model=str(tiny_model_dir))
    found = inspect_for_dialog(str(tiny_model_dir), options, "r8", _plenty, cuda_available=False)
    draft_bytes = found.draft_weight_bytes + found.draft_kv_bytes

    assert found.draft_weight_bytes == _by_precision(alone)[alone.auto_precision].weight_bytes  # auto's pick
    assert found.draft_kv_bytes == 2 * 1024 * KV_BYTES_PER_TOKEN  # two of its 1 024-token contexts, bf16
    assert [item.total_bytes for item in found.estimates] == [item.total_bytes + draft_bytes for item in alone.estimates]
    loaded = open_model(str(tiny_model_dir), options, lambda _e: None, lambda *_: None, lambda: False)
    assert loaded.draft is not None and loaded.draft.weight_bytes == pytest.approx(found.draft_weight_bytes, rel=0.01)
    pool = ModelDrafts(loaded, BLOCK_SIZE, 4).kv
    assert pool.num_blocks * pool.bytes_per_block == found.draft_kv_bytes


def test_a_model_that_fits_only_without_its_draft_model_is_refused_with_it(tiny_model_dir: Path, monkeypatch):
    from engine.models import memory_estimate, model_open

    alone = inspect_for_dialog(str(tiny_model_dir), LoadOptions(device="cpu"), "r9", _plenty, cuda_available=False)
    just_enough = _by_precision(alone)["fp32"].total_bytes  # "tight" alone, at the precision asked
    options = LoadOptions(device="cpu", precision="fp32", context_length=1024, draft_model=str(tiny_model_dir))
    found = inspect_for_dialog(str(tiny_model_dir), options, "r9", lambda _d: just_enough, cuda_available=False)
    assert _by_precision(found)["fp32"].verdict == "won't fit"

    monkeypatch.setattr(memory_estimate, "available_memory", lambda _device: just_enough)
    with pytest.raises(memory_estimate.NotEnoughMemoryError, match="The draft model takes"):
        model_open.open_model(str(tiny_model_dir), options, lambda _e: None, lambda *_: None, lambda: False)


def test_a_model_that_takes_no_draft_model_counts_none(tmp_path: Path, tiny_model_dir: Path):
    from tests.engine.models.fallback_models import FOLDER_VOCAB, random_model, tiny_config, write_folder

    stablelm = write_folder(tmp_path / "stablelm", random_model(tiny_config("stablelm", FOLDER_VOCAB)))
    options = LoadOptions(device="cpu", draft_model=str(tiny_model_dir))
    found = inspect_for_dialog(str(stablelm), options, "r10", _plenty, cuda_available=False)

    assert (found.draft_weight_bytes, found.draft_kv_bytes) == (0, 0)  # it runs through transformers: nothing drafts
