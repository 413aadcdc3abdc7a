"""Loads a model and its tokenizer from a Hugging Face folder or a GGUF file (engine thread).

Nothing from a model folder ever runs as code: ``trust_remote_code`` stays off.
A GGUF file of a Llama-family model is read as it is, tensor by tensor into the fast
path's formats (``gguf_direct``); other GGUF architectures go through transformers,
which dequantizes them into fp32. A safetensors folder of such a model streams the
same way (``safetensors_state``): one tensor read, converted and packed at a time.
Llama-family models run on the fast path: on the CPU ``llama_forward`` in fp32, fp16
(with an int4 copy for decode steps when the file is 4-bit) or int4 weights, on a
GPU ``cuda_backend`` in bf16/fp16/fp32, int8 or int4 weights (``quant_int``).
Everything else runs through transformers (``HFBackend``), with
bitsandbytes for int8 (LLM.int8) and int4 (NF4). Which formats, exactly, is the
``LoadPlan``'s ``FormatPlan`` (``format_plan``), decided before any weight is read.

On the CPU, at int4 or int8, a model the fast path does not run goes to the quantized transformers fallback
(``quantized_fallback``) instead of bitsandbytes: transformers' model built empty, each linear layer packed into
Hearth's formats as its tensor is read from the folder or GGUF file, never an fp32 copy of the whole model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine.chat.chat_template import ChatTemplate
from engine.forward.backend import Backend, HFBackend
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.fast_scope import unsupported_reason
from engine.forward.windows import layer_windows
from engine.forward.native.build import kernel_notices
from engine.host.allocator import return_freed_memory
from engine.models import gguf_direct, quantized_fallback
from engine.models.format_plan import FormatPlan, ModelTraits, choose_formats
from engine.models.gguf_check import read_gguf
from engine.models.model_files import quantized_table_bytes
from engine.models.safetensors_state import SafetensorsState
from engine.models.weight_progress import report_tensors
from engine.protocol.messages import ChatMessage

Progress = Callable[[int, int], None]  # (tensors done, tensors in all)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    formats: FormatPlan
    context_length: int
    weight_bytes: int
    eos_ids: frozenset[int]
    load_s: float
    template: ChatTemplate
    notices: tuple[str, ...] = ()
    kv_budget_bytes: int | None = None  # what the KV block pool may take (``context_choice``); None: not planned
    context_reason: str = ""  # why ``context_length``, in words (``LoadPlan.context_reason``)
    draft: LoadedModel | None = None  # a model with the same tokenizer drafting for this one (``draft_pairing``)

    def render(self, messages: Sequence[ChatMessage], tools: Sequence[str] = ()) -> str:
        """The chat as prompt text, ending where the assistant's reply begins (sandboxed template), with the
        functions ``tools`` offered (``ChatTemplate.render``)."""
        bos = self.tokenizer.bos_token or ""
        eos = self.tokenizer.eos_token or ""
        return self.template.render(messages, add_generation_prompt=True, bos_token=bos, eos_token=eos, tools=tools)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def held_weight_bytes(self) -> int:
        """The weights this load holds: the model's and its draft model's."""
        return self.weight_bytes + (self.draft.weight_bytes if self.draft else 0)

    @property
    def precision(self) -> str:
        """The precision's name (``format_plan.PRECISIONS``)."""
        return self.formats.precision

    @property
    def precision_label(self) -> str:
        """The formats as the user reads them (``FormatPlan.label``), e.g. "fp16 weights, int4 copy for decoding"."""
        return self.formats.label


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
    ``formats``: the plan chosen with the memory estimate (``model_open``); None (random
    models, tests) lets the loader choose it from ``precision`` (which may be "auto")
    once it has read the model's config, with ``four_bit_source``: the file stores its
    layers in 4 bits, and ``eight_bit_source``: in Q8_0 (``ModelSource.eight_bit_layers``).
    ``kv_budget_bytes``: the KV cache the estimate counted for ``context_length``, which the
    block pool may take (None: not planned, ``kv_pool_budget``'s default). ``context_reason``: why
    ``context_length``, in words (``ContextChoice.reason``; "" where nothing chose it).
    """

    folder: Path
    name: str
    device: torch.device
    precision: str
    context_length: int
    template: ChatTemplate
    notices: tuple[str, ...] = ()
    four_bit_source: bool = False
    formats: FormatPlan | None = None
    eight_bit_source: bool = False
    kv_budget_bytes: int | None = None
    context_reason: str = ""


def is_gguf(plan: LoadPlan) -> bool:
    return plan.folder.suffix.lower() == ".gguf" and plan.folder.is_file()


def fast_path_applies(config: Any, device: torch.device) -> bool:
    """Whether the fast path (``llama_forward``) can run this model here (the CPU or a GPU, a Llama-family
    architecture; on a GPU neither sliding windows, which its decode kernel does not take, nor a mixture of experts,
    whose steps are built and checked on the CPU alone)."""
    windowed = any(window is not None for window in layer_windows(config))
    gpu_ready = not windowed and not getattr(config, "num_experts", 0)
    return (device.type == "cpu" or (device.type == "cuda" and gpu_ready)) and unsupported_reason(config) is None


def formats_of(plan: LoadPlan, config: Any | None, kept_table: bool = False) -> FormatPlan:
    """``plan``'s formats: those chosen before the load, else ``choose_formats``' for ``config`` (None: a model
    the fast path cannot run). A GGUF file whose header promised the fast path but which holds tensors it does
    not place (``gguf_direct.direct_reason``) goes through transformers at the same precision."""
    fast = config is not None and fast_path_applies(config, plan.device)
    if plan.formats is not None and (fast or not plan.formats.fast_path):
        return plan.formats
    traits = ModelTraits(fast, getattr(config, "vocab_size", 0), getattr(config, "hidden_size", 0),
                         plan.four_bit_source, kept_table, eight_bit_layers=plan.eight_bit_source,
                         tied=bool(getattr(config, "tie_word_embeddings", False)))
    return choose_formats(plan.device.type, plan.precision, traits)


def _fast_backend(config: Any, state: Any, formats: FormatPlan, plan: LoadPlan) -> tuple[Any, Backend, LoadPlan]:
    """The fast path's model and backend; on a GPU the plan gains its context cap and notices."""
    if plan.device.type != "cuda":
        model = FastLlama(config, state, formats, plan.device, plan.context_length)
        return_freed_memory()  # the last tensors' temporaries
        return model, FastLlamaBackend(model), replace(plan, notices=plan.notices + kernel_notices())
    from engine.forward.cuda_backend import open_gpu_backend

    backend = open_gpu_backend(config, state, formats, plan.device, plan.context_length)
    return_freed_memory()
    notices = plan.notices + backend.notices(formats.layers, plan.context_length)
    if backend.capacity >= plan.context_length:
        return backend.model, backend, replace(plan, notices=notices)
    return backend.model, backend, replace(plan, context_length=backend.capacity, notices=notices,
                                           context_reason=backend.capacity_reason)


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
    formats = formats_of(plan, config)
    report = cancellable(progress, is_cancelled)
    if formats.fast_path:
        model, backend, plan = _fast_backend(config, SafetensorsState(plan.folder, report), formats, plan)
        eos_ids = _eos_ids(_generation_config(plan.folder), config, tokenizer)
        return _assemble(model, backend, model.weight_bytes, eos_ids, tokenizer, plan, formats, started)
    if formats.quantized_fallback:
        hf_model = quantized_fallback.load_folder(plan.folder, config, formats, report)
        return _fallback_model(hf_model, tokenizer, plan, formats, started, _generation_config(plan.folder))
    with report_tensors(report):
        hf_model = _load_weights(plan.folder, plan.device, formats)
    return wrap_model(hf_model, tokenizer, replace(plan, formats=formats), started)


def _load_gguf(plan: LoadPlan, report: Progress, started: float) -> LoadedModel:
    """A GGUF file straight into the fast path where it applies, else into the quantized fallback, else through
    transformers (fp32 on the way)."""
    contents = read_gguf(plan.folder)
    tokenizer = gguf_direct.load_tokenizer(plan.folder)
    config = gguf_direct.hf_config(contents) if gguf_direct.direct_reason(contents) is None else None
    formats = formats_of(plan, config, kept_table=quantized_table_bytes(contents) is not None)
    if formats.quantized_fallback:
        hf_model = quantized_fallback.load_gguf(plan.folder, contents, formats, report)
        eos_ids = gguf_direct.end_token_ids(contents)
        return _fallback_model(hf_model, tokenizer, plan, formats, started, hf_model.generation_config, eos_ids)
    if not formats.fast_path:
        with report_tensors(report):
            hf_model = _load_weights(plan.folder, plan.device, formats)
        return wrap_model(hf_model, tokenizer, replace(plan, formats=formats), started)
    on_cpu = plan.device.type == "cpu"
    state = gguf_direct.GGUFState(plan.folder, contents, "int4" in (formats.layers, formats.decode_copy), report,
                                  all_groups=formats.layers == "int4",
                                  table_format=formats.output_layer if on_cpu else None, cpu_layout=on_cpu,
                                  int8_groups=on_cpu and formats.layers == "int8")
    model, backend, plan = _fast_backend(config, state, formats, plan)
    eos_ids = gguf_direct.end_token_ids(contents) | _eos_ids(config, tokenizer)
    return _assemble(model, backend, model.weight_bytes, eos_ids, tokenizer, plan, formats, started)


def wrap_model(model: Any, tokenizer: Any, plan: LoadPlan, started: float) -> LoadedModel:
    """A loaded transformers model as a ``LoadedModel``, repacked for the fast path where its formats say so."""
    eos_ids = _eos_ids(getattr(model, "generation_config", None), model.config, tokenizer)
    formats = formats_of(plan, model.config)
    if formats.fast_path:  # the transformers copy is dropped
        fast, backend, plan = _fast_backend(model.config, model.state_dict(), formats, plan)
        return _assemble(fast, backend, fast.weight_bytes, eos_ids, tokenizer, plan, formats, started)
    return _assemble(model, HFBackend(model), weight_bytes(model), eos_ids, tokenizer, plan, formats, started)


def _fallback_model(model: Any, tokenizer: Any, plan: LoadPlan, formats: FormatPlan, started: float,
                    generation_config: Any, eos_ids: frozenset[int] = frozenset()) -> LoadedModel:
    """The quantized fallback's model (``quantized_fallback``) as a ``LoadedModel``, with its notice."""
    eos_ids |= _eos_ids(generation_config, model.config, tokenizer)
    plan = replace(plan, notices=plan.notices + (quantized_fallback.fallback_notice(formats, model),) + kernel_notices())
    held = weight_bytes(model) + quantized_fallback.packed_bytes(model)
    return _assemble(model, HFBackend(model), held, eos_ids, tokenizer, plan, formats, started)


def _assemble(
    model: Any, backend: Backend, n_bytes: int, eos_ids: frozenset[int], tokenizer: Any,
    plan: LoadPlan, formats: FormatPlan, started: float,
) -> LoadedModel:
    return LoadedModel(
        name=plan.name,
        path=str(plan.folder),
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        device=plan.device.type,
        formats=formats,
        context_length=plan.context_length,
        weight_bytes=n_bytes,
        eos_ids=eos_ids,
        load_s=time.perf_counter() - started,
        template=plan.template,
        notices=plan.notices,
        kv_budget_bytes=plan.kv_budget_bytes,
        context_reason=plan.context_reason,
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


def _load_weights(folder: Path, device: torch.device, formats: FormatPlan) -> Any:
    """transformers' model of a folder, or of a GGUF file (``folder`` is then the file: it dequantizes to fp32),
    in ``formats``: plain dtypes, or bitsandbytes' int8 or NF4 layers."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": False, "use_safetensors": True}
    if folder.suffix.lower() == ".gguf":
        kwargs, folder = {"gguf_file": folder.name, "trust_remote_code": False}, folder.parent
    kwargs["dtype"] = DTYPES[formats.compute]
    if formats.quantized_layers:
        kwargs["quantization_config"] = _bnb_config(formats.layers)
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    if not formats.quantized_layers:
        model.to(device)
    return model.eval()


def _bnb_config(layers: str) -> Any:
    """bitsandbytes' config for ``layers`` "int8" (LLM.int8) or "nf4"."""
    from transformers import BitsAndBytesConfig

    if layers == "int8":
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
