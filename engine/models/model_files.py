"""Decide whether a model folder or GGUF file is safe and loadable (engine thread).

``inspect_model`` reads only metadata: config.json, safetensors headers, the GGUF
header and tables. It never unpickles, never imports code from the model folder
(``trust_remote_code`` stays off), and never loads a tensor. Everything it refuses
raises ``ModelFileError`` with a message for the user: what is wrong, in which
file, and what to do. transformers is imported lazily, on the first folder check.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType

from engine.chat.chat_template import find_folder_template
from engine.models.gguf_check import (
    DIRECT_ARCHITECTURES, PLAIN_TYPES, GGUFContents, gguf_config, read_gguf, refuse_unreadable_types,
)
from engine.models.model_source import ModelFileError, ModelSource, read_model_json
from engine.models.safetensors_check import (
    INDEX_FILE, SafetensorsHeader, check_config_numbers, read_safetensors_header, read_sharded_headers,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
SINGLE_FILE = "model.safetensors"
GGUF_ARCHITECTURE_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}
NOT_TEXT_GENERATORS = {"general", "tokenizer", "t5", "umt5"}


def inspect_model(path: str | Path) -> ModelSource:
    """Check ``path`` (a Hugging Face model folder or a .gguf file) without loading it."""
    path = Path(path).expanduser()
    try:
        return _inspect_path(path)
    except OSError as error:
        raise ModelFileError(
            f"Hearth could not read {error.filename or path}: {error.strerror or error}. "
            f"Check that the file is readable by you and the disk is working."
        ) from None


def _inspect_path(path: Path) -> ModelSource:
    if not path.exists():
        raise ModelFileError(f"{path} does not exist. Pick a model folder or a .gguf file that is there.")
    if path.is_dir():
        for entry in path.iterdir():
            _refuse_special_file(entry)
        return _inspect_folder(path)
    _refuse_special_file(path)
    if path.suffix.lower() == ".gguf":
        return _inspect_gguf(path)
    raise ModelFileError(
        f"{path.name} is neither a model folder nor a .gguf file. Pick the folder that holds "
        f"config.json and the .safetensors weights, or a single .gguf file. ({path})"
    )


def _refuse_special_file(path: Path) -> None:
    """Refuse a FIFO, socket or device (opening one can block forever); a broken link is left to whoever opens it."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ModelFileError(
            f"{path.name} is not a regular file (it is a pipe, socket or device), so Hearth will not open it. "
            f"Pick a model folder or a .gguf file saved on disk. ({path})"
        )


# ---------------------------------------------------------------- GGUF files


def _inspect_gguf(path: Path) -> ModelSource:
    contents = read_gguf(path)
    config = gguf_config(path, contents)
    _check_gguf_architecture(path, config["architecture"])
    refuse_unreadable_types(path, contents)
    template = contents.metadata.get("tokenizer.chat_template")
    return ModelSource(
        kind="gguf",
        path=path,
        name=path.stem,
        config=config,
        weight_files=(path,),
        total_weight_bytes=sum(tensor.n_bytes for tensor in contents.tensors),
        n_params=sum(tensor.n_elements for tensor in contents.tensors),
        chat_template_source=template if isinstance(template, str) else None,
        chat_template_origin=f"{path.name} (metadata tokenizer.chat_template)" if template else None,
        kept_table_bytes=quantized_table_bytes(contents),
        kept_expert_bytes=mxfp4_bytes(contents),
    )


def quantized_table_bytes(contents: GGUFContents) -> int | None:
    """The token table's bytes where the file holds it in quantized blocks (the CPU fast path keeps those:
    ``gguf_blocks.BlockTable``); None for F16, BF16 or F32."""
    table = next((tensor for tensor in contents.tensors if tensor.name == "token_embd.weight"), None)
    return table.n_bytes if table is not None and table.quant_type not in PLAIN_TYPES else None


MXFP4_SUFFIXES = ("_blocks", "_scales")  # openai's checkpoints' MXFP4 experts, bytes of codes and exponents


def mxfp4_bytes(contents: GGUFContents) -> int | None:
    """The bytes of the file's MXFP4 tensors (gpt-oss's experts, which the fast path keeps as they are:
    ``weights.mxfp4``); None where it has none."""
    total = sum(tensor.n_bytes for tensor in contents.tensors if tensor.quant_type == GGMLQuantizationType.MXFP4)
    return total or None


def _check_gguf_architecture(path: Path, architecture: str) -> None:
    """Refuse an architecture neither the fast path (``DIRECT_ARCHITECTURES``, checked without importing
    transformers' GGUF code, a noticeable part of a small model's load) nor transformers reads."""
    if architecture in DIRECT_ARCHITECTURES:
        return
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    name = GGUF_ARCHITECTURE_ALIASES.get(architecture, architecture)
    if name in NOT_TEXT_GENERATORS or name not in GGUF_SUPPORTED_ARCHITECTURES:
        supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - NOT_TEXT_GENERATORS)
        raise ModelFileError(
            f"{path.name} holds a {architecture!r} model, which Hearth cannot load from GGUF "
            f"(it can load: {', '.join(supported)}). Pick a model of one of those kinds, or its "
            f"safetensors folder. ({path})"
        )


# ---------------------------------------------------------------- model folders


def _inspect_folder(folder: Path) -> ModelSource:
    config_path = folder / "config.json"
    if not config_path.is_file():
        return _folder_without_config(folder)
    config = _read_config(config_path)
    _refuse_remote_code(config_path, config)
    _check_architecture(config_path, config)
    headers, notes = folder_weights(folder)
    check_config_numbers(config_path, config, headers)
    template = find_folder_template(folder)
    blocks, scales = (sum(tensor.n_elements for header in headers for tensor in header.tensors
                          if tensor.name.endswith(suffix)) for suffix in MXFP4_SUFFIXES)
    return ModelSource(
        kind="hf_folder",
        path=folder,
        name=folder.name,
        config=config,
        weight_files=tuple(header.path for header in headers),
        total_weight_bytes=sum(header.data_bytes for header in headers),
        n_params=sum(header.n_params for header in headers) + blocks - scales,  # a block byte: two weights
        chat_template_source=template[0] if template else None,
        chat_template_origin=template[1] if template else None,
        notes=notes,
        kept_expert_bytes=blocks + scales or None,
    )


def _folder_without_config(folder: Path) -> ModelSource:
    """A folder with no config.json: accept a lone .gguf in it, otherwise say what is missing."""
    entries = sorted(folder.iterdir())
    if not entries:
        raise ModelFileError(f"The folder {folder} is empty. Pick the folder that holds the model's files.")
    gguf_files = [entry for entry in entries if entry.suffix.lower() == ".gguf" and entry.is_file()]
    if len(gguf_files) == 1:
        return _inspect_gguf(gguf_files[0])
    if gguf_files:
        names = ", ".join(entry.name for entry in gguf_files)
        raise ModelFileError(f"The folder {folder} holds several GGUF files ({names}). Pick one of them.")
    raise ModelFileError(
        f"The folder {folder} has no config.json, so it is not a Hugging Face model folder. "
        f"Pick the folder that holds config.json and the .safetensors weights, or a .gguf file."
    )


def _read_config(config_path: Path) -> dict[str, Any]:
    config = read_model_json(config_path)
    if not isinstance(config, dict):
        raise ModelFileError(f"config.json does not hold a JSON object. Download the model again. ({config_path})")
    return config


def _refuse_remote_code(config_path: Path, config: dict[str, Any]) -> None:
    if "auto_map" in config:
        raise ModelFileError(
            f"config.json asks to run Python code shipped in the model folder (\"auto_map\"). "
            f"Hearth never runs code from model folders (trust_remote_code stays off), because "
            f"that code could do anything on this computer. Pick a model that transformers "
            f"supports natively. ({config_path})"
        )


def _check_architecture(config_path: Path, config: dict[str, Any]) -> None:
    """The model type must be known to transformers and buildable by AutoModelForCausalLM."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelFileError(
            f"config.json names model_type {model_type!r}, which this version of transformers "
            f"does not know. Update Hearth, or pick another model. ({config_path})"
        )
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = config.get("architectures") or []
    unknown = [name for name in architectures if name not in causal_classes]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or unknown:
        what = unknown[0] if unknown else model_type
        raise ModelFileError(
            f"config.json describes a {what!r} model, which is not a text-generation (causal "
            f"language) model that Hearth can chat with. Pick a chat or instruct model. ({config_path})"
        )


def folder_weights(folder: Path) -> tuple[list[SafetensorsHeader], tuple[str, ...]]:
    """Validated safetensors headers of the weights transformers would load, and notes."""
    pickles = sorted(entry for entry in folder.iterdir() if entry.suffix.lower() in PICKLE_SUFFIXES)
    if (folder / INDEX_FILE).is_file():
        headers = read_sharded_headers(folder / INDEX_FILE)
    elif (folder / SINGLE_FILE).is_file():
        headers = [read_safetensors_header(folder / SINGLE_FILE)]
    elif pickles:
        raise _pickle_refusal(folder, pickles)
    else:
        raise _no_weights(folder)
    notes = (f"Ignored pickle files (not safe to open): {', '.join(p.name for p in pickles)}.",) if pickles else ()
    return headers, notes


def _pickle_refusal(folder: Path, pickles: list[Path]) -> ModelFileError:
    example = pickles[0].name
    return ModelFileError(
        f"The weights in {folder} are pickle checkpoints ({', '.join(p.name for p in pickles)}). "
        f"Hearth does not open pickle files: loading one can run any code hidden inside it. "
        f"Convert the weights to safetensors once, in an environment you trust, e.g. for {example}: "
        f"python -c \"import torch; from safetensors.torch import save_file; "
        f"sd = torch.load('{example}', weights_only=True); "
        f"save_file({{k: v.clone() for k, v in sd.items()}}, 'model.safetensors', metadata={{'format': 'pt'}})\" "
        f"(or load it with transformers and call save_pretrained(..., safe_serialization=True)), "
        f"then open the folder again."
    )


def _no_weights(folder: Path) -> ModelFileError:
    others = sorted(entry.name for entry in folder.glob("*.safetensors"))
    if others:
        return ModelFileError(
            f"{folder} has config.json and {', '.join(others)}, but transformers loads only "
            f"{SINGLE_FILE} or shards listed in {INDEX_FILE}. Rename the weights file to "
            f"{SINGLE_FILE} if it holds the whole model."
        )
    return ModelFileError(
        f"{folder} has config.json but no weights ({SINGLE_FILE} or {INDEX_FILE}). "
        f"Download the .safetensors files too."
    )
