"""Which formats a model's weights, prompts and caches run in: decided once, before a load (any thread; no torch).

``choose_formats`` is the one place these rules live. The loader reads its ``FormatPlan`` (``loading``),
``FastLlama`` builds its weights from it, the memory estimate counts its bytes (``memory_estimate``) and the
window shows its ``label``. Its inputs: the device, the precision (the user's, or ``auto``'s pick by memory), what
the model is (``ModelTraits``: whether the fast path runs it, whether its file stores 4-bit layers) and what the
CPU offers (``HostFeatures``).

Precisions, as the user picks them: ``fp32``, ``bf16``, ``fp16``, ``int8``, ``int4``. On the fast path ``int4`` is
asymmetric 4-bit with a scale and zero per group (``quant_int``); through transformers it is bitsandbytes'
NF4 (a normal-float table) on a GPU, and the plan's layer format then says ``nf4``. On the CPU a model the fast path
does not run takes ``int4`` and ``int8`` in the quantized transformers fallback (``quantized_fallback``): transformers'
forward with Hearth's packed layers, in the fast path's formats. Earlier versions called both 4-bit formats ``nf4``;
``messages.canonical_precision`` maps that name to ``int4``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.forward.family import ties_embeddings
from engine.forward.fast_scope import config_view, unsupported_reason
from engine.forward.native.support import has_amx_kernels, has_prompt_kernel, may_run
from engine.forward.weights.packed_sizes import INT4_PAIR, OUTPUT_ROWS, int8_kernel_takes
from engine.host.cpu_features import has_amx_tiles, has_fp16_math, has_int8_dot
from engine.models.gguf_check import DIRECT_ARCHITECTURES
from engine.models.model_source import ModelSource
from engine.protocol.messages import KV_CACHES
from engine.protocol.messages import PRECISIONS as OPTIONS
from engine.protocol.messages import canonical_precision

PRECISIONS = tuple(name for name in OPTIONS if name != "auto")
FAST_LAYERS = {"cpu": ("fp32", "fp16", "int8", "int4"), "cuda": PRECISIONS}  # the rest go through transformers
TRANSFORMERS_LAYERS = {"int4": "nf4"}  # on a GPU bitsandbytes' NF4; int8 is its LLM.int8, the others plain dtypes
QUANTIZED = ("int8", "int4")
QUANTIZED_LAYERS = (*QUANTIZED, "nf4")
FOUR_BIT_PROMPT_PARAMS = 1_000_000_000
"""Without Hearth's prompt kernel, from this many parameters a 4-bit file's prompts run faster from its 4-bit weights
(``int4_prompts``: oneDNN's int8 GEMMs) than from an fp16 copy, on a CPU with int8 dot products and no fp16
arithmetic; a smaller model's run faster with the copy."""
FORMAT_WORDS = {"nf4": "nf4 (bitsandbytes)"}  # formats the label words otherwise than by their names


@dataclass(frozen=True)
class HostFeatures:
    """What the CPU offers the formats (``cpu_features``): Hearth's kernels may run (``native.support``), AMX's
    bf16 tiles (granted to this process), int8 dot products, fp16 arithmetic, and whether Hearth's int4 kernel
    takes prompt chunks (``support.has_prompt_kernel``)."""

    native_kernels: bool = False
    amx_tiles: bool = False
    int8_dot: bool = False
    fp16_math: bool = False
    prompt_kernel: bool = False


def this_host() -> HostFeatures:
    """This machine's ``HostFeatures`` (tests replace it to plan for another CPU)."""
    return HostFeatures(may_run(), has_amx_kernels() and has_amx_tiles(), has_int8_dot(), has_fp16_math(),
                        has_prompt_kernel())


@dataclass(frozen=True)
class ModelTraits:
    """What the plan needs to know of a model: whether the fast path runs it, whether its file stores its layers
    in 4-bit blocks or in Q8_0 ones (a Q8_0 file's, or gpt-oss's beside MXFP4 experts: ``eight_bit_layers``), or its
    token table in quantized ones (``kept_table``), its vocabulary, width and size, and whether its experts stay in
    the file's MXFP4 blocks (``mxfp4_experts``), and whether its token table is its output layer's weight
    (``tied``)."""

    fast_path: bool
    vocab: int
    hidden: int
    four_bit_layers: bool = False
    kept_table: bool = False
    n_params: int = 0
    eight_bit_layers: bool = False
    mxfp4_experts: bool = False
    tied: bool = False


@dataclass(frozen=True)
class FormatPlan:
    """The formats a load uses, decided once (``choose_formats``).

    ``device``: "cpu" or "cuda". ``precision``: the user's name for it. ``fast_path``: ``FastLlama`` runs it (else
    transformers). ``layers``: the attention and MLP weights' format; ``decode_copy``: a second copy of them for
    calls of few rows (decode steps), or None. ``output_layer`` and ``token_table``: their formats ("file": the
    table as the file keeps it, decoded when looked up). ``compute``: the activations' dtype, which the KV cache
    (``kv_cache``) keeps, but for the CPU fast path's bf16; ``prompt_attention``: a prompt chunk's attention dtype.
    ``prompt_path``: which kernel multiplies a prompt's rows, in words. ``note``: why ``auto`` chose these, when not the default.
    ``kv_precision``: the KV cache the user asked for (``messages.KV_CACHES``; "int8" holds on the CPU fast path
    only, ``kv_cache``).
    """

    device: str
    precision: str
    fast_path: bool
    layers: str
    output_layer: str
    token_table: str
    compute: str
    prompt_attention: str
    prompt_path: str
    decode_copy: str | None = None
    host: HostFeatures = HostFeatures()
    note: str = ""
    kv_precision: str = "auto"
    mxfp4_experts: bool = False  # the fast path keeps the experts in their MXFP4 blocks, whatever ``layers`` says

    @property
    def kv_cache(self) -> str:
        """The KV cache's dtype: "int8" where the user asked for it on the CPU fast path (codes and a scale per 32
        values, ``kv_layout``); else bf16 in the CPU fast path's block pool (half fp32's bytes, as llama.cpp's fp16;
        its kernels widen each key and value exactly and sum in fp32), else the compute dtype. fp32 weights, the
        reference precision a user picks to rule out rounding, keep an fp32 cache (read by torch's ops)."""
        cpu_fast = self.device == "cpu" and self.fast_path
        if cpu_fast and self.kv_precision == "int8":
            return "int8"
        return "bf16" if cpu_fast and self.layers != "fp32" else self.compute

    @property
    def kv_notice(self) -> str | None:
        """Why an int8 KV cache that was asked for is not kept (the load's notice), or None."""
        if self.kv_precision != "int8" or self.kv_cache == "int8":
            return None
        where = ("a GPU keeps its own" if self.device != "cpu"
                 else "this model runs through transformers, which keeps its own")
        return (f"The int8 KV cache runs in Hearth's own forward pass on the CPU only ({where}): this load keeps a "
                f"{self.kv_cache} KV cache.")

    @property
    def experts(self) -> str:
        """A mixture of experts' format (``engine.forward.experts``): the decode copy's alone where the plan has one
        (the experts are most of such a model's bytes, and a decode row reads few of them), else the layers'. MXFP4
        experts stay in their blocks whatever it says, their activations in fp32 where it is fp32."""
        return self.decode_copy or self.layers

    @property
    def label(self) -> str:
        """The formats as the window and the load line show them, e.g. "fp16 weights, int4 copy for decoding", or
        gpt-oss's "fp16 weights, MXFP4 experts as stored, int8 copy for decoding"."""
        label = f"{FORMAT_WORDS.get(self.layers, self.layers)} weights"
        if self.quantized_fallback:
            label = f"quantized transformers fallback ({self.layers})"
        if self.mxfp4_experts and self.fast_path:
            label += ", MXFP4 experts as stored"
        if self.decode_copy:
            label += f", {self.decode_copy} copy for decoding"
        return f"{label} ({self.note})" if self.note else label

    @property
    def quantized_layers(self) -> bool:
        return self.layers in QUANTIZED_LAYERS

    @property
    def quantized_fallback(self) -> bool:
        """transformers' model with its linear layers packed in Hearth's int4 or int8 as they are read
        (``quantized_fallback``): a model the fast path does not run, quantized, on the CPU."""
        return not self.fast_path and self.device == "cpu" and self.layers in QUANTIZED


def choose_formats(device: str, precision: str, model: ModelTraits, host: HostFeatures | None = None,
                   note: str = "", kv_cache: str = "auto") -> FormatPlan:
    """The plan for ``model`` at ``precision`` on ``device`` ("cpu" or "cuda"), with the KV cache ``kv_cache``
    asks for (``messages.KV_CACHES``). ``precision`` "auto" without a memory estimate (random models, tests):
    bf16 on a GPU; on the CPU fp16 on the fast path (fp32 sums, within rounding of fp32 at half the bytes), else
    fp32. An int8 KV cache holds on the CPU fast path only: elsewhere the plan keeps its usual cache and says so
    (``FormatPlan.kv_notice``): a GPU's kernels read fp16/bf16 alone, and transformers keeps its own cache."""
    host = this_host() if host is None and device == "cpu" else host or HostFeatures()
    precision = _resolved(canonical_precision(precision), device, model.fast_path)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(PRECISIONS)})")
    if model.fast_path and precision in FAST_LAYERS[device]:
        plan = fast_formats(device, precision, model, host, _decode_copy(device, precision, model, host), note)
    elif device == "cpu" and precision in QUANTIZED:
        plan = _fallback_formats(precision, model, host, note)
    else:
        plan = _transformers_formats(device, precision, host, note)
    if kv_cache not in KV_CACHES:
        raise ValueError(f"unknown KV cache {kv_cache!r} (known: {', '.join(KV_CACHES)})")
    return replace(plan, kv_precision=kv_cache, mxfp4_experts=model.mxfp4_experts)


def _decode_copy(device: str, precision: str, model: ModelTraits, host: HostFeatures) -> str | None:
    """The CPU's second copy of fp16 layers for decode steps, in the file's own blocks: a 4-bit file's ``int4``
    groups; Q8_0 layers (a Q8_0 file's, gpt-oss's) as ``int8`` groups of 32 on Hearth's kernel (exactly the file's
    blocks, about half of fp16's bytes: a decode step of the 2-layer gpt-oss-20b cut reads 314 MB where fp16 read
    519 MB, and the SmolLM2-1.7B shape in Q8_0 decodes 21.7 tok/s where fp16 took 10.4)."""
    if device != "cpu" or precision != "fp16":
        return None
    if model.four_bit_layers:
        return "int4"
    return "int8" if model.eight_bit_layers and host.native_kernels else None


def _resolved(precision: str, device: str, fast_path: bool) -> str:
    if precision != "auto":
        return precision
    if device == "cuda":
        return "bf16"
    return "fp16" if fast_path else "fp32"


def fast_formats(device: str, layers: str, model: ModelTraits, host: HostFeatures, decode_copy: str | None = None,
                 note: str = "") -> FormatPlan:
    """``FastLlama``'s plan with its layers in ``layers`` (and ``decode_copy``): ``choose_formats``' rules for the
    rest."""
    compute = "fp32" if device == "cpu" else (layers if layers in ("fp32", "bf16", "fp16") else "bf16")
    output = _output_layer(device, layers, decode_copy, model, host)
    amx_prompts = device == "cpu" and layers == "int4" and host.amx_tiles
    return FormatPlan(
        device=device, precision=layers, fast_path=True, layers=layers, decode_copy=decode_copy,
        output_layer=output, token_table=_token_table(device, layers, output, compute, model), compute=compute,
        prompt_attention="bf16" if amx_prompts else compute, prompt_path=_prompt_path(device, layers, host),
        host=host, note=note,
    )


def _output_layer(device: str, layers: str, decode_copy: str | None, model: ModelTraits, host: HostFeatures) -> str:
    """The output layer multiplies only the rows that are sampled, so on the CPU it is read once a decode step,
    whatever the prompt: beside quantized layers (alone or as a decode copy), int8 on Hearth's
    kernel where it takes the shape (``native.int8_matmul``: SmolLM2-135M's step 30 MB against FBGEMM's padded fp16 101 MB; SmolLM2-1.7B's
    107 MB against 126 MB in two planes of 4-bit groups, read in one pass instead of two), else those two planes
    (``INT4_PAIR``) beside int4 layers, fp16 beside int8 ones; elsewhere the layers' format."""
    if device != "cpu":
        return layers
    if (layers in QUANTIZED or decode_copy is not None) and host.native_kernels and int8_kernel_takes(model.vocab,
                                                                                                      model.hidden):
        return "int8"
    if layers not in QUANTIZED:
        return layers
    return INT4_PAIR if layers == "int4" else "fp16"


def _token_table(device: str, layers: str, output: str, compute: str, model: ModelTraits) -> str:
    """On a GPU the compute dtype. On the CPU the int8 output layer's own rows where the table is tied to it
    (``OUTPUT_ROWS``: the table is not held twice, llama.cpp's one tensor for both), else the file's own quantized
    blocks where it has them (``kept_table``, ``gguf_blocks.BlockTable``, decoded exactly when looked up, in a
    fraction of fp16's bytes), else two planes of 4-bit groups beside 4-bit layers alone, fp16 beside an fp16 or
    int8 output layer, else the compute dtype."""
    if device != "cpu":
        return compute
    if model.tied and output == "int8":
        return OUTPUT_ROWS
    if model.kept_table:
        return "file"
    if layers == "int4":
        return INT4_PAIR
    return "fp16" if output in ("fp16", "int8") else compute


def _prompt_path(device: str, layers: str, host: HostFeatures) -> str:
    """Which kernel multiplies a prompt's rows, in words."""
    if device == "cuda":
        return {"int8": "bf16 cuBLAS, int8 GEMV for one row", "int4": "PyTorch's int4 kernel"}.get(
            layers, f"{layers} cuBLAS")
    if layers == "int4":
        if host.amx_tiles:
            return "AMX bf16 tiles"
        if host.prompt_kernel:
            return "Hearth's int4 kernel"
        return "int8 GEMM" if host.int8_dot else "fp32 matmul"
    if layers == "int8":
        return "Hearth's int8 kernel" if host.native_kernels else "fp32 matmul"
    if layers == "fp16":
        return "oneDNN fp16" if host.fp16_math else "FBGEMM fp16"
    return f"{layers} matmul"


def _transformers_formats(device: str, precision: str, host: HostFeatures, note: str) -> FormatPlan:
    """transformers' model: plain dtypes, or bitsandbytes (LLM.int8, NF4) whose other weights, activations and
    caches stay in bf16 on a GPU and fp32 on the CPU."""
    layers = TRANSFORMERS_LAYERS.get(precision, precision)
    compute = ("bf16" if device == "cuda" else "fp32") if precision in QUANTIZED else precision
    return FormatPlan(
        device=device, precision=precision, fast_path=False, layers=layers, output_layer=compute,
        token_table=compute, compute=compute, prompt_attention=compute,
        prompt_path="transformers with bitsandbytes" if precision in QUANTIZED else "transformers",
        host=host, note=note,
    )


def _fallback_formats(layers: str, model: ModelTraits, host: HostFeatures, note: str) -> FormatPlan:
    """The quantized transformers fallback on the CPU: its linear layers in ``layers`` (int4 groups of 32, or int8)
    on Hearth's kernels, the output layer as the fast path's beside such layers (``_output_layer``; int8 beside
    int8), token tables in bf16 (``packed_linear.TABLE_DTYPE``), everything else and the activations in fp32."""
    output = "int8" if layers == "int8" else _output_layer("cpu", layers, None, model, host)
    return FormatPlan(
        device="cpu", precision=layers, fast_path=False, layers=layers, output_layer=output, token_table="bf16",
        compute="fp32", prompt_attention="fp32", prompt_path=f"transformers, linear layers on Hearth's {layers} kernel",
        host=host, note=note,
    )


def four_bit_prompts_faster(model: ModelTraits, host: HostFeatures | None = None) -> bool:
    """Whether ``host`` (None: this CPU) runs a 4-bit file's prompts faster from its 4-bit weights than from an fp16
    copy, so that ``auto`` keeps the 4-bit weights alone whatever memory allows (its decode steps run from them
    either way): any size with AMX's bf16 tiles or Hearth's prompt kernel (``native.int4_matmul``; 1.3-1.7x an fp16
    copy's rate from 135M to 4B parameters on AVX-512 and AVX2 alike, docs/performance.md), else from
    ``FOUR_BIT_PROMPT_PARAMS`` with int8 dot products and no fp16 arithmetic."""
    if not model.four_bit_layers:
        return False
    host = host or this_host()
    if host.amx_tiles or host.prompt_kernel:
        return True
    return model.n_params >= FOUR_BIT_PROMPT_PARAMS and host.int8_dot and not host.fp16_math


def eight_bit_prompts_faster(model: ModelTraits, host: HostFeatures | None = None) -> bool:
    """Whether ``host`` (None: this CPU) runs a Q8_0 file's prompts (``ModelTraits.eight_bit_layers``) faster from
    its int8 blocks than from an fp16 copy, so that ``auto`` keeps them alone (a third of fp16 and its int8 decode
    copy's bytes): where Hearth's prompt kernels run (the avx512, avx2vnni and avx2 variants), whose int8 kernel
    takes a prompt chunk at one code a value at 1.1-3x FBGEMM's fp16 rate (``native.int8_matmul``)."""
    return model.eight_bit_layers and (host or this_host()).prompt_kernel


def is_direct_gguf(source: ModelSource) -> bool:
    """A GGUF file the fast path reads as it is (``gguf_direct``), not through transformers."""
    return source.kind == "gguf" and source.config.get("architecture") in DIRECT_ARCHITECTURES


def reads_fast(source: ModelSource) -> bool:
    """Whether the fast path loads ``source`` into its own formats: a GGUF file it reads directly, or a
    safetensors folder of an architecture it runs."""
    if source.kind == "gguf":
        return is_direct_gguf(source)
    return unsupported_reason(config_view(source.config)) is None


def traits_of(source: ModelSource) -> ModelTraits:
    """``source``'s ``ModelTraits``, from its checked headers."""
    config = source.config
    vocab = config.get("vocab_size") or 0
    hidden = config.get("embedding_length") or (config.get("text_config") or config).get("hidden_size") or 0
    return ModelTraits(reads_fast(source), vocab, hidden, source.four_bit_layers, source.kept_table_bytes is not None,
                       source.n_params, source.eight_bit_layers, source.kept_expert_bytes is not None,
                       ties_embeddings(config))


def formats_for_source(source: ModelSource, device: str, precision: str, note: str = "",
                       kv_cache: str = "auto") -> FormatPlan:
    """``choose_formats`` for a checked model file."""
    return choose_formats(device, precision, traits_of(source), note=note, kv_cache=kv_cache)
