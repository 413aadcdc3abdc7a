"""What Hearth knows about a model file before loading it (any thread).

``ModelSource`` is the result of inspecting a model folder or GGUF file; it holds
plain data only, so it may be logged, compared in tests, or summarised in a
``ModelLoaded`` event. ``ModelFileError`` is raised for every file that Hearth
refuses; its message says what is wrong, in which file, and what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SourceKind = Literal["hf_folder", "gguf"]
DEFAULT_CONTEXT = 2048
CONTEXT_KEYS = ("max_position_embeddings", "context_length", "n_positions", "max_seq_len")
EIGHT_BIT_FILE_TYPES = ("MOSTLY_Q8_0", "MOSTLY_MXFP4_MOE")  # GGUF file types whose layers hold Q8_0 blocks


class ModelFileError(Exception):
    """A model file or folder that Hearth will not load; ``str(error)`` is for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def read_model_json(path: Path) -> Any:
    """A JSON file of a model folder, parsed; a broken one is a ``ModelFileError`` naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(f"{path.name} is not valid JSON ({error}). Download the model again. ({path})") from None


@dataclass(frozen=True)
class ModelSource:
    """A checked model: nothing in it has been executed or loaded into memory.

    ``config`` is the parsed config.json for ``hf_folder``; for ``gguf`` it holds the
    architecture metadata (see ``engine.models.gguf_check.GGUF_CONFIG_KEYS``).
    ``n_params`` counts weight elements read from the safetensors headers or the
    GGUF tensor table. ``chat_template_source`` is the template text, and
    ``chat_template_origin`` names where it came from (for error messages).
    """

    kind: SourceKind
    path: Path
    name: str
    config: dict[str, Any]
    weight_files: tuple[Path, ...]
    total_weight_bytes: int
    n_params: int
    chat_template_source: str | None = None
    chat_template_origin: str | None = None
    notes: tuple[str, ...] = field(default=())
    kept_table_bytes: int | None = None  # a GGUF file's token table in quantized blocks, kept so on the CPU
    kept_expert_bytes: int | None = None  # a GGUF file's experts in MXFP4 blocks (gpt-oss), kept so

    @property
    def four_bit_layers(self) -> bool:
        """A GGUF file of a 4-bit llama.cpp file type (Q4_0, Q4_1, Q4_K_S, Q4_K_M): its layers hold 4-bit blocks
        (Q4_K_M keeps a few in 6 bits)."""
        return self.kind == "gguf" and str(self.config.get("file_type") or "").startswith("MOSTLY_Q4")

    @property
    def eight_bit_layers(self) -> bool:
        """A GGUF file whose layers hold Q8_0 blocks: llama.cpp's Q8_0 file type, or a gpt-oss file (MXFP4_MOE: its
        experts in MXFP4, its other layers in Q8_0, as ggml-org's files hold them)."""
        return self.kind == "gguf" and self.config.get("file_type") in EIGHT_BIT_FILE_TYPES

    @property
    def native_context(self) -> int:
        """The context length the model was trained for (HF config or GGUF metadata)."""
        for key in CONTEXT_KEYS:
            value = self.config.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return DEFAULT_CONTEXT
