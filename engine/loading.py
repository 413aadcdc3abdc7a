"""Loads a model and its tokenizer from a Hugging Face folder or a GGUF file (engine thread).

Nothing from a model folder ever runs as code: ``trust_remote_code`` stays off.
GGUF files are converted once into a cached folder (see ``gguf_convert``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine.backend import Backend, HFBackend
from engine.chat_template import ChatTemplate
from engine.messages import ChatMessage

Progress = Callable[[int, int], None]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
QUANTIZED = ("int8", "nf4")


class LoadCancelled(Exception):
    """The user cancelled the load; the previous model stays."""


@dataclass
class LoadedModel:
    """A model ready to answer; owned by the engine thread."""

    name: str
    path: str
    model: Any
    tokenizer: Any
    backend: Backend
    device: str
    precision: str
    context_length: int
    weight_bytes: int
    eos_ids: frozenset[int]
    load_s: float
    template: ChatTemplate
    notices: tuple[str, ...] = ()

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The chat as prompt text, ending where the assistant's reply begins (sandboxed template)."""
        bos = self.tokenizer.bos_token or ""
        eos = self.tokenizer.eos_token or ""
        return self.template.render(messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA was requested, but no CUDA GPU is available to PyTorch on this machine.")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


@dataclass(frozen=True)
class LoadPlan:
    """What to load and how, decided before any weight is read."""

    folder: Path
    name: str
    device: torch.device
    precision: str
    context_length: int
    template: ChatTemplate
    notices: tuple[str, ...] = ()


def load_model(plan: LoadPlan, progress: Progress, is_cancelled: Callable[[], bool]) -> LoadedModel:
    """Load the Hugging Face folder of ``plan`` (already inspected and found safe)."""
    started = time.perf_counter()
    steps = 3
    progress(0, steps)
    tokenizer = _load_tokenizer(plan.folder)
    _checkpoint(is_cancelled, progress, 1, steps)
    model = _load_weights(plan.folder, plan.device, plan.precision)
    _checkpoint(is_cancelled, progress, 2, steps)
    loaded = LoadedModel(
        name=plan.name,
        path=str(plan.folder),
        model=model,
        tokenizer=tokenizer,
        backend=HFBackend(model),
        device=plan.device.type,
        precision=plan.precision,
        context_length=plan.context_length,
        weight_bytes=weight_bytes(model),
        eos_ids=_eos_ids(model, tokenizer),
        load_s=time.perf_counter() - started,
        template=plan.template,
        notices=plan.notices,
    )
    progress(steps, steps)
    return loaded


def _checkpoint(is_cancelled: Callable[[], bool], progress: Progress, done: int, total: int) -> None:
    if is_cancelled():
        raise LoadCancelled()
    progress(done, total)


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _load_weights(folder: Path, device: torch.device, precision: str) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": False, "use_safetensors": True}
    if precision in QUANTIZED:
        kwargs["quantization_config"] = _bnb_config(precision)
        kwargs["dtype"] = torch.bfloat16 if device.type == "cuda" else torch.float32
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    else:
        kwargs["dtype"] = DTYPES[precision]
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    if precision not in QUANTIZED:
        model.to(device)
    return model.eval()


def _bnb_config(precision: str) -> Any:
    from transformers import BitsAndBytesConfig

    if precision == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes held by parameters and buffers (packed bytes for quantized weights)."""
    tensors = [*model.parameters(), *model.buffers()]
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if tensor.data_ptr() in seen:
            continue  # tied weights count once
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total
