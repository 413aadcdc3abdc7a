"""Loads a model and its tokenizer from a Hugging Face folder or a GGUF file (engine thread).

Nothing from a model folder ever runs as code: ``trust_remote_code`` stays off.
A GGUF file of a Llama-family model is read as it is, tensor by tensor into the fast
path's formats (``gguf_direct``); other GGUF architectures go through transformers,
which dequantizes them into fp32. A safetensors folder of such a model streams the
same way (``safetensors_state``): one tensor read, converted and packed at a time.
Llama-family models run on the fast path: on the CPU ``fast_llama`` in fp32, fp16
(with a 4-bit copy for decode steps when the file is 4-bit) or 4-bit weights, on a
GPU ``cuda_backend`` in bf16/fp16/fp32, int8 or 4-bit weights (``quant_int``).
Everything else runs through transformers (``HFBackend``), with
bitsandbytes for int8 and nf4.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine.chat.chat_template import ChatTemplate
from engine.forward.backend import Backend, HFBackend
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.llama_weights import head_format
from engine.forward.fast_scope import unsupported_reason
from engine.forward.weights.quant_int import fast_format
from engine.host.allocator import return_freed_memory
from engine.models import gguf_direct
from engine.models.gguf_check import read_gguf
from engine.models.safetensors_state import SafetensorsState
from engine.models.weight_progress import report_tensors
from engine.protocol.messages import ChatMessage

Progress = Callable[[int, int], None]  # (tensors done, tensors in all)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
QUANTIZED = ("int8", "nf4")
DECODE_COPY_ENV = "HEARTH_DECODE_COPY"


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
    format_note: str = ""  # why these formats, when memory decided (``LoadPlan.format_note``)

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The chat as prompt text, ending where the assistant's reply begins (sandboxed template)."""
        bos = self.tokenizer.bos_token or ""
        eos = self.tokenizer.eos_token or ""
        return self.template.render(messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def precision_label(self) -> str:
        """The precision as the user reads it; fp16 with a 4-bit copy for decode steps says so."""
        copy = getattr(self.model, "decode_fmt", None)  # only the fast path keeps one (``decode_format``)
        label = f"{self.precision}, 4-bit decode" if copy == "int4" else self.precision
        return f"{label} ({self.format_note})" if self.format_note else label


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA was requested, but no CUDA GPU is available to PyTorch on this machine.")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


@dataclass(frozen=True)
class LoadPlan:
    """What to load and how, decided before any weight is read.

    ``folder``: the Hugging Face folder, or the GGUF file (``is_gguf``).
    ``precision`` passed the memory check; ``precision_is_auto`` says the user left
    the choice to Hearth, which then takes fp16 weights over fp32 on the fast path.
    ``four_bit_source``: the file stores its layers in 4 bits (see ``decode_format``).
    ``format_note``: why the formats are these, when memory decided (shown with the precision).
    """

    folder: Path
    name: str
    device: torch.device
    precision: str
    context_length: int
    template: ChatTemplate
    notices: tuple[str, ...] = ()
    precision_is_auto: bool = False
    four_bit_source: bool = False
    format_note: str = ""


def is_gguf(plan: LoadPlan) -> bool:
    return plan.folder.suffix.lower() == ".gguf" and plan.folder.is_file()


def resolve_precision(requested: str, device: torch.device, fast_path: bool) -> str:
    """``auto`` without a memory estimate (random models): bf16 on a GPU, else fp32, then ``prefer_fast``."""
    if requested != "auto":
        return requested
    return prefer_fast("bf16" if device.type == "cuda" else "fp32", fast_path)


def prefer_fast(precision: str, fast_path: bool) -> str:
    """On the CPU fast path fp16 weights read half the bytes per token with fp32 sums: logits
    stay within rounding of fp32, so an automatic fp32 becomes fp16 there."""
    return "fp16" if fast_path and precision == "fp32" else precision


def decode_format(fmt: str, plan: LoadPlan) -> str | None:
    """The format of a second copy of the layers for decode steps, or None.

    fp16 on the CPU keeps one in 4 bits when the file's layers are 4-bit: their blocks
    come back exactly (``quant_int``) and a decode step reads a third of fp16's bytes,
    while prompts (many rows at once) still run on fp16's faster kernel. It costs 0.63
    bytes per layer weight on top of fp16's 2 (``memory_estimate`` counts them).
    The two paths round differently, so a reply's cached keys and values differ slightly
    from what a fresh prompt gives; ``HEARTH_DECODE_COPY=0`` turns the copy off.
    """
    wanted = os.environ.get(DECODE_COPY_ENV, "1") != "0"
    return "int4" if wanted and plan.four_bit_source and fmt == "fp16" and plan.device.type == "cpu" else None


def fast_path_applies(config: Any, device: torch.device) -> bool:
    """Whether ``fast_llama`` can run this model here (the CPU or a GPU, a Llama-family architecture)."""
    return device.type in ("cpu", "cuda") and unsupported_reason(config) is None


def _fast_backend(config: Any, state: Any, fmt: str, plan: LoadPlan) -> tuple[Any, Backend, LoadPlan]:
    """The fast path's model and backend; on a GPU the plan gains its context cap and notices."""
    if plan.device.type != "cuda":
        model = FastLlama(config, state, fmt, plan.device, decode_format(fmt, plan))
        return_freed_memory()  # the last tensors' temporaries
        return model, FastLlamaBackend(model), plan
    from engine.forward.cuda_backend import open_gpu_backend

    backend = open_gpu_backend(config, state, fmt, plan.device, plan.context_length)
    return_freed_memory()
    notices = plan.notices + backend.notices(fmt, plan.context_length)
    return backend.model, backend, replace(plan, context_length=min(plan.context_length, backend.capacity), notices=notices)


def load_model(plan: LoadPlan, progress: Progress, is_cancelled: Callable[[], bool]) -> LoadedModel:
    """Load the Hugging Face folder of ``plan`` (already inspected and found safe).

    ``progress`` counts tensors; a cancel is noticed between two of them. On the fast
    path (CPU or GPU) the tensors go one at a time from the safetensors files into
    ``FastLlama``'s formats (``SafetensorsState``), without building a transformers model first.
    """
    started = time.perf_counter()
    if is_gguf(plan):
        return _load_gguf(plan, cancellable(progress, is_cancelled), started)
    tokenizer = _load_tokenizer(plan.folder)
    _raise_if_cancelled(is_cancelled)
    config = _load_config(plan.folder)
    fast = fast_path_applies(config, plan.device)
    precision = prefer_fast(plan.precision, fast) if plan.precision_is_auto else plan.precision
    report = cancellable(progress, is_cancelled)
    fmt = fast_format(precision, plan.device) if fast else None
    if fmt:
        model, backend, plan = _fast_backend(config, SafetensorsState(plan.folder, report), fmt, plan)
        eos_ids = _eos_ids(_generation_config(plan.folder), config, tokenizer)
        return _assemble(model, backend, model.weight_bytes, eos_ids, tokenizer, plan, precision, started)
    with report_tensors(report):
        hf_model = _load_weights(plan.folder, plan.device, precision)
    return wrap_model(hf_model, tokenizer, plan, precision, started)


def _load_gguf(plan: LoadPlan, report: Progress, started: float) -> LoadedModel:
    """A GGUF file straight into the fast path where it applies, else through transformers (fp32 on the way)."""
    contents = read_gguf(plan.folder)
    tokenizer = gguf_direct.load_tokenizer(plan.folder)
    config = gguf_direct.hf_config(contents) if gguf_direct.direct_reason(contents) is None else None
    fast = config is not None and fast_path_applies(config, plan.device)
    precision = prefer_fast(plan.precision, fast) if plan.precision_is_auto else plan.precision
    fmt = fast_format(precision, plan.device) if fast else None
    if fmt is None:
        with report_tensors(report):
            hf_model = _load_weights(plan.folder, plan.device, precision)
        return wrap_model(hf_model, tokenizer, plan, precision, started)
    decode_fmt = decode_format(fmt, plan)
    groups = "int4" in (fmt, decode_fmt)
    head_fmt = head_format(fmt, decode_fmt, plan.device, config.vocab_size, config.hidden_size)
    state = gguf_direct.GGUFState(plan.folder, contents, groups, report, all_groups=fmt == "int4",
                                  table_format=head_fmt if plan.device.type == "cpu" else None,
                                  cpu_layout=plan.device.type == "cpu")
    model, backend, plan = _fast_backend(config, state, fmt, plan)
    eos_ids = gguf_direct.end_token_ids(contents) | _eos_ids(config, tokenizer)
    return _assemble(model, backend, model.weight_bytes, eos_ids, tokenizer, plan, precision, started)


def wrap_model(model: Any, tokenizer: Any, plan: LoadPlan, precision: str, started: float) -> LoadedModel:
    """A loaded transformers model as a ``LoadedModel``, repacked for the fast path where it applies."""
    eos_ids = _eos_ids(getattr(model, "generation_config", None), model.config, tokenizer)
    fmt = fast_format(precision, plan.device) if fast_path_applies(model.config, plan.device) else None
    if fmt:  # the transformers copy is dropped
        fast, backend, plan = _fast_backend(model.config, model.state_dict(), fmt, plan)
        return _assemble(fast, backend, fast.weight_bytes, eos_ids, tokenizer, plan, precision, started)
    return _assemble(model, HFBackend(model), weight_bytes(model), eos_ids, tokenizer, plan, precision, started)


def _assemble(
    model: Any, backend: Backend, n_bytes: int, eos_ids: frozenset[int], tokenizer: Any,
    plan: LoadPlan, precision: str, started: float,
) -> LoadedModel:
    return LoadedModel(
        name=plan.name,
        path=str(plan.folder),
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        device=plan.device.type,
        precision=precision,
        context_length=plan.context_length,
        weight_bytes=n_bytes,
        eos_ids=eos_ids,
        load_s=time.perf_counter() - started,
        template=plan.template,
        notices=plan.notices,
        format_note=plan.format_note,
    )


def _generation_config(folder: Path) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(str(folder)) if (folder / "generation_config.json").is_file() else None


def _raise_if_cancelled(is_cancelled: Callable[[], bool]) -> None:
    if is_cancelled():
        raise LoadCancelled()


def cancellable(progress: Progress, is_cancelled: Callable[[], bool]) -> Progress:
    """``progress`` that first raises ``LoadCancelled`` once the load was cancelled (checked per tensor)."""

    def report(done: int, total: int) -> None:
        _raise_if_cancelled(is_cancelled)
        progress(done, total)

    return report


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _load_config(folder: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)


def _load_weights(folder: Path, device: torch.device, precision: str) -> Any:
    """transformers' model of a folder, or of a GGUF file (``folder`` is then the file: it dequantizes to fp32)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": False, "use_safetensors": True}
    if folder.suffix.lower() == ".gguf":
        kwargs, folder = {"gguf_file": folder.name, "trust_remote_code": False}, folder.parent
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


def _eos_ids(*sources: Any) -> frozenset[int]:
    """Every end-of-sequence id named by the generation config, the model config or the tokenizer."""
    ids: set[int] = set()
    for source in sources:
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
