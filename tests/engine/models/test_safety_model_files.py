"""inspect_model accepts real checkpoints and refuses each kind of unsafe or broken folder."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Callable

import pytest

from engine.models.model_files import inspect_model
from engine.models.model_source import ModelFileError


class _RunsCodeWhenUnpickled:
    """Unpickling this creates ``marker``: proof that a pickle ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def refusal(path: Path) -> str:
    with pytest.raises(ModelFileError) as caught:
        inspect_model(path)
    return str(caught.value)


def write_config(folder: Path, config: Any) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_tiny_hf_folder_is_accepted(tiny_hf_folder: Path) -> None:
    source = inspect_model(tiny_hf_folder)
    assert source.kind == "hf_folder"
    assert source.name == "tiny-llama"
    assert source.config["model_type"] == "llama"
    assert [file.name for file in source.weight_files] == ["model.safetensors"]
    embeddings, layer = 64 * 16, 16 * 16 + 2 * (16 * 8) + 16 * 16 + 3 * 16 * 32 + 2 * 16
    assert source.n_params == 2 * embeddings + 2 * layer + 16  # untied head, final norm
    assert source.chat_template_source is not None and source.chat_template_origin is not None
    assert source.chat_template_origin.endswith("tokenizer_config.json")


def test_sharded_hf_folder_is_accepted(tiny_hf_folder: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_folder, dtype=torch.float32)
    model.save_pretrained(sharded, max_shard_size="4KB")
    source = inspect_model(sharded)
    assert len(source.weight_files) > 1
    assert source.n_params == inspect_model(tiny_hf_folder).n_params


def test_missing_path(tmp_path: Path) -> None:
    assert "does not exist" in refusal(tmp_path / "nowhere")


def test_empty_folder(tmp_path: Path) -> None:
    assert "is empty" in refusal(tmp_path)


def test_file_that_is_neither_folder_nor_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert "notes.txt is neither a model folder nor a .gguf file" in refusal(path)


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("hi")
    assert "has no config.json" in refusal(tmp_path)


def test_folder_holding_a_single_gguf_opens_it(tiny_gguf: Callable[..., Path]) -> None:
    path = tiny_gguf()
    assert inspect_model(path.parent).path == path


def test_config_without_weights(tmp_path: Path, tiny_hf_folder: Path) -> None:
    folder = write_config(tmp_path / "m", json.loads((tiny_hf_folder / "config.json").read_text()))
    assert "has config.json but no weights" in refusal(folder)


def test_config_that_is_not_json(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{model_type: llama")
    message = refusal(folder)
    assert "config.json is not valid JSON" in message and str(folder) in message


def test_unknown_model_type(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    write_config(folder, {"model_type": "hearth_imaginary", "architectures": ["X"]})
    assert "model_type 'hearth_imaginary'" in refusal(folder)


def test_architecture_that_is_not_a_causal_lm(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    config = json.loads((folder / "config.json").read_text())
    write_config(folder, config | {"architectures": ["LlamaForSequenceClassification"]})
    assert "'LlamaForSequenceClassification' model, which is not a text-generation" in refusal(folder)


def test_auto_map_is_refused(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    config = json.loads((folder / "config.json").read_text())
    write_config(folder, config | {"auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilModel"}})
    message = refusal(folder)
    assert "auto_map" in message and "trust_remote_code stays off" in message


def test_pickle_only_checkpoint_is_refused_with_conversion_advice(
    hf_copy: Callable[[], Path], tmp_path: Path
) -> None:
    folder = hf_copy()
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pickle-ran"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(marker)))
    message = refusal(folder)
    assert "pytorch_model.bin" in message
    assert "save_file" in message and "weights_only=True" in message
    assert not marker.exists()


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".ckpt"])
def test_other_pickle_suffixes_are_refused(hf_copy: Callable[[], Path], suffix: str) -> None:
    folder = hf_copy()
    (folder / "model.safetensors").unlink()
    (folder / f"weights{suffix}").write_bytes(b"\x80\x04N.")
    assert "pickle checkpoints" in refusal(folder)


def test_pickle_beside_safetensors_is_ignored_unopened(hf_copy: Callable[[], Path], tmp_path: Path) -> None:
    folder = hf_copy()
    marker = tmp_path / "pickle-ran"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(marker)))
    source = inspect_model(folder)
    assert [file.name for file in source.weight_files] == ["model.safetensors"]
    assert "pytorch_model.bin" in source.notes[0]
    assert not marker.exists()


def test_damaged_weights_in_a_folder_name_the_file(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    message = refusal(folder)
    assert "model.safetensors is not a usable safetensors file" in message and "truncated" in message


def test_weights_under_a_name_transformers_ignores(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    (folder / "model.safetensors").rename(folder / "consolidated.safetensors")
    assert "Rename the weights file to model.safetensors" in refusal(folder)


def test_tokenizer_config_that_is_not_json(hf_copy: Callable[[], Path]) -> None:
    folder = hf_copy()
    (folder / "tokenizer_config.json").write_text("{")
    assert "tokenizer_config.json is not valid JSON" in refusal(folder)


def test_unreadable_file_is_explained(tiny_gguf: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_gguf()

    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)
    message = refusal(path)
    assert f"could not read {path}: Permission denied" in message
