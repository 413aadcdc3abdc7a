"""How much memory a model will need, and which precision fits (engine thread).

Estimates are arithmetic on the checked ``ModelSource``: the exact parameter count
(from safetensors headers or the GGUF tensor table) and the shape in its config.
torch is imported only by ``available_memory("cuda")``.

Every estimate counts the formats of the ``FormatPlan`` the load would use (``format_plan.choose_formats``,
the same call the loader's plan comes from), so the two cannot disagree about formats:

* Weights through transformers: parameters × bytes per parameter of the layers' format. Under int8 and
  NF4, bitsandbytes quantizes only the linear layers; the token embeddings and the
  output head stay in 16-bit, and are counted so.
* A model the fast path loads into its own formats, a GGUF file it reads directly
  (``gguf_direct``) or a safetensors folder of an architecture it runs (``fast_scope``,
  streamed by ``safetensors_state``), is counted as ``FastLlama`` holds it: its layers in the plan's format (int4:
  groups of 32, ``INT4_KERNEL_BYTES`` per weight on Hearth's CPU kernels, else ``INT4_BYTES``; int8 groups of 32,
  ``INT8_BYTES``; fp16 on the CPU as FBGEMM packs it, ``packed_sizes``), the plan's decode
  copy, and the token table and the output layer apart even when the file ties them, each in the plan's format.
  Its tensors are read one at a time, so the load holds no more than that and one tensor on its way. A mixture of
  experts' experts (``ModelShape.expert_params``) are held once, in the plan's ``experts`` format: a 4-bit file's
  in int4 beside fp16 layers too; a file's MXFP4 experts (gpt-oss) as the file holds them, whatever the plan.
  On the CPU ``auto`` picks fp16 (with an int4 decode copy of a 4-bit file) where it fits comfortably, else int4
  alone; a 4-bit file runs int4 alone where its prompts run faster so (``format_plan.four_bit_prompts_faster``),
  and a Q8_0 file int8 alone, else int4 (``format_plan.eight_bit_prompts_faster``).
* The quantized transformers fallback (``quantized_fallback``: a model the fast path does not run, at int4 or int8
  on the CPU) holds what it packs as each tensor is read: every matrix but the token tables in the layers'
  format (int4: as the fast path's; int8: the int8 kernel's ``INT8_BYTES``; the few norms and biases
  counted so too), the output layer in the plan's format, the token tables in bf16, and no fp32 copy.
* Any other GGUF file goes through transformers, which dequantizes every tensor into
  fp32 before the model takes them: ``FP32_BYTES`` per parameter more while it loads.
* KV cache: 2 (keys and values) × layers × KV heads × head size × context × bytes of the plan's
  ``kv_cache`` dtype (bf16 on the CPU fast path, which computes in fp32 whatever its weights' format; int8 where
  asked, 1 + 2/32 bytes a value with its share of the fp16 scales: ``kv_layout.KV_VALUE_BYTES``), the context
  rounded up to ``KV_POOL_TOKENS``: what the block pool sized from it holds (``context_choice.kv_budget_bytes``).
  A sliding-window layer (``windows.layer_windows``) holds its window and ``KV_POOL_TOKENS`` at most: the pool
  lets go of its blocks before the window.
* Overhead: activations, allocator slack and the runtime itself, taken as
  ``OVERHEAD_FIXED_BYTES`` plus ``OVERHEAD_FRACTION`` of weights and KV cache (and for the quantized fallback
  ``FALLBACK_RUNTIME_BYTES``, transformers' own).

``fit_verdict`` says "fits" when the total is at most ``TIGHT_FRACTION`` (85 %) of the
available memory, "tight" up to 100 %, and "won't fit" beyond.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import psutil

from engine.forward.family import ties_embeddings
from engine.forward.kv_layout import KV_VALUE_BYTES
from engine.forward.weights.packed_sizes import OUTPUT_ROWS, fp16_packed_bytes, int8_bytes
from engine.forward.windows import layer_windows
from engine.models.format_plan import (
    INT4_PAIR, FormatPlan, eight_bit_prompts_faster, formats_for_source, four_bit_prompts_faster, reads_fast,
    traits_of,
)
from engine.models.model_source import ModelFileError, ModelSource

Verdict = Literal["fits", "tight", "won't fit"]

BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "nf4": 0.5 + 4 / 64}  # nf4: fp32 scale per 64
BNB_QUANTIZED = ("int8", "nf4")  # bitsandbytes' formats, which keep the embeddings and output head in 16 bits
UNQUANTIZED_BYTES = 2.0  # embeddings and output head under bitsandbytes stay in bf16
INT4_BYTES = 0.5 + 4 / 32  # int4 as PyTorch's kernels take it: 4 bits, and a bf16 scale and zero point per 32 weights
INT4_KERNEL_BYTES = 0.5 + 2 / 32 + 4 / 256  # Hearth's CPU kernels' (``int4_scales``): int8 codes, bf16 factors
INT8_BYTES = 1.0 + 2 / 32  # the CPU's int8 kernel: a byte a weight, an fp16 scale per 32
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
PRECISION_ORDER = {"cuda": ("bf16", "int8", "int4"), "cpu": ("fp32", "bf16", "int4")}
FALLBACK_GGUF_ORDER = ("int8", "int4")  # a GGUF file the fast path does not read, on the CPU (a 4-bit one: int4)
FAST_CPU_ORDER = ("fp16", "int4")  # the CPU fast path's: fp16 (+ an int4 decode copy of a 4-bit file), int4 alone
EIGHT_BIT_CPU_ORDER = ("int8", "int4")  # a Q8_0 file's where its int8 blocks alone run its prompts faster
FAST_LAYER_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": INT8_BYTES, "int4": INT4_BYTES}
FP32_BYTES = 4.0
KV_POOL_TOKENS = 256
"""The KV block pool holds whole blocks (16 tokens); a context is counted in whole multiples of this, which any
block size up to it divides."""
TIGHT_FRACTION = 0.85
OVERHEAD_FIXED_BYTES = 256 * 1024**2
FALLBACK_RUNTIME_BYTES = 128 * 1024**2
"""What the quantized fallback's runtime holds beyond the fast path's: transformers' modelling code and its model's
objects (resident after the imports: 340 MB against the engine's own 230 MB, on the development machine)."""
OVERHEAD_FRACTION = 0.05


class NotEnoughMemoryError(ModelFileError):
    """No precision lets the model fit in the memory available; the message gives the estimate."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes that decide memory use, from an HF config.json or GGUF metadata."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    tied_embeddings: bool
    experts: int = 0  # a mixture of experts' experts per layer (0: a dense model)
    expert_intermediate: int = 0  # each expert's MLP width
    moe_layers: int = 0  # the layers that are mixtures (the rest dense MLPs of ``intermediate``)

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embeddings and output head (one matrix if tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def expert_params(self) -> int:
        """Parameters of every layer's experts (gate, up and down each), which the fast path holds in
        ``FormatPlan.experts``."""
        return self.moe_layers * self.experts * 3 * self.hidden * self.expert_intermediate


@dataclass(frozen=True)
class MemoryEstimate:
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    total_bytes: int


# Names that config.json files of different model families use for the same size.
HF_SHAPE_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
}


def _required(config: Mapping[str, Any], names: tuple[str, ...], what: str) -> int:
    for name in names:
        if isinstance(config.get(name), int):
            return config[name]
    raise ModelFileError(
        f"The model's config does not give its {what} ({' or '.join(names)}), "
        f"so Hearth cannot estimate its memory use."
    )


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read the shape from an HF config (``num_hidden_layers``…) or a GGUF config (``block_count``…)."""
    if "block_count" in config:
        hidden, heads = config["embedding_length"], config["head_count"]
        return ModelShape(
            layers=config["block_count"], hidden=hidden, heads=heads,
            kv_heads=config.get("head_count_kv") or heads,
            head_dim=config.get("key_length") or hidden // heads,
            vocab=config.get("vocab_size") or 0, intermediate=config.get("feed_forward_length") or 0,
            tied_embeddings=ties_embeddings(config),
            experts=config.get("expert_count") or 0, expert_intermediate=config.get("expert_feed_forward_length") or 0,
            moe_layers=config["block_count"] if config.get("expert_count") else 0,
        )
    tied = ties_embeddings(config)
    config = config.get("text_config") or config
    hidden = _required(config, HF_SHAPE_KEYS["hidden"], "hidden size")
    heads = _required(config, HF_SHAPE_KEYS["heads"], "number of attention heads")
    layers = _required(config, HF_SHAPE_KEYS["layers"], "number of layers")
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    return ModelShape(
        layers=layers, hidden=hidden, heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab=config.get("vocab_size") or 0,
        intermediate=config.get("intermediate_size") or config.get("n_inner") or 4 * hidden,
        tied_embeddings=tied,
        experts=experts, expert_intermediate=config.get("moe_intermediate_size") or _gpt_oss_experts(config),
        moe_layers=_moe_layers(config, layers) if experts else 0,
    )


def _gpt_oss_experts(config: Mapping[str, Any]) -> int:
    """gpt-oss's experts' width: its ``intermediate_size`` (it has no dense MLP); 0 for other configs."""
    return (config.get("intermediate_size") or 0) if config.get("model_type") == "gpt_oss" else 0


def _moe_layers(config: Mapping[str, Any], layers: int) -> int:
    """How many layers of a Qwen-MoE config are mixtures: every ``decoder_sparse_step``-th, but those in
    ``mlp_only_layers``."""
    step, dense = config.get("decoder_sparse_step") or 1, set(config.get("mlp_only_layers") or ())
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)


def params_from_config(config: Mapping[str, Any]) -> int:
    """Parameter count of a Llama-style decoder from its shape alone (no biases).

    Use it when no weights are at hand (e.g. to size a model before downloading);
    ``ModelSource.n_params`` is exact and preferred when there is a source.
    """
    shape = model_shape(config)
    attention = shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads)  # q, o, k, v
    mlp = 3 * shape.hidden * shape.intermediate  # gate, up, down
    norms = 2 * shape.hidden
    dense = shape.layers * (attention + norms) + (shape.layers - shape.moe_layers) * mlp
    return dense + _mixture_params(config, shape) + shape.embedding_params + shape.hidden


def _mixture_params(config: Mapping[str, Any], shape: ModelShape) -> int:
    """The mixtures' parameters: the experts, each layer's router, and Qwen2-MoE's shared expert and its gate."""
    config = config.get("text_config") or config
    shared = config.get("shared_expert_intermediate_size") or config.get("expert_shared_feed_forward_length") or 0
    per_layer = shape.experts * shape.hidden + (3 * shape.hidden * shared + shape.hidden if shared else 0)
    return shape.expert_params + shape.moe_layers * per_layer


def estimate_weight_bytes(n_params: int, layers: str, unquantized_params: int = 0) -> int:
    """Bytes of transformers' weights with ``layers`` in that format; ``unquantized_params`` stay 16-bit under
    bitsandbytes' int8 and nf4."""
    if layers not in BYTES_PER_PARAM:
        raise ValueError(f"unknown format {layers!r} (known: {', '.join(BYTES_PER_PARAM)})")
    if layers not in BNB_QUANTIZED:
        return int(n_params * BYTES_PER_PARAM[layers])
    quantized = max(n_params - unquantized_params, 0)
    return int(quantized * BYTES_PER_PARAM[layers] + unquantized_params * UNQUANTIZED_BYTES)


def estimate_kv_bytes(config_like: Mapping[str, Any], context_length: int, dtype_bytes: float) -> int:
    """KV cache bytes for ``context_length`` tokens: 2 × kv_heads × head_dim × bytes a value (``dtype_bytes``:
    int8's 1.0625 counts its scales) for each token each layer holds, the whole context, or a sliding-window layer's
    window and ``KV_POOL_TOKENS`` where that is less."""
    shape = model_shape(config_like)
    held = sum(context_length if window is None else min(context_length, window + KV_POOL_TOKENS)
               for window in config_windows(config_like, shape.layers))
    return int(2 * shape.kv_heads * shape.head_dim * held * dtype_bytes)


def config_windows(config: Mapping[str, Any], layers: int) -> tuple[int | None, ...]:
    """``layer_windows`` of a parsed config (its ``text_config`` where it has one) of ``layers`` layers; a GGUF
    config's ``layer_windows`` (``gguf_check.gguf_config``: no window where it has none)."""
    if "block_count" in config:
        return tuple(config.get("layer_windows") or (None,) * layers)
    text = config.get("text_config") or config
    return layer_windows(SimpleNamespace(**{**text, "num_hidden_layers": layers}))


def precision_order(source: ModelSource, device: str) -> tuple[str, ...]:
    """The precisions ``auto`` tries on ``device``, best first."""
    if device == "cpu" and reads_fast(source):
        traits = traits_of(source)
        if four_bit_prompts_faster(traits):
            return ("int4",)
        return EIGHT_BIT_CPU_ORDER if eight_bit_prompts_faster(traits) else FAST_CPU_ORDER
    if device == "cpu" and source.kind == "gguf":  # the quantized fallback, near the file's own size
        return ("int4",) if source.four_bit_layers else FALLBACK_GGUF_ORDER
    return PRECISION_ORDER[device]


def _fast_weight_bytes(source: ModelSource, shape: ModelShape, formats: FormatPlan) -> int:
    """What ``FastLlama`` holds for a model it loads in ``formats`` (see the module docstring); a mixture's experts
    in one copy, in ``formats.experts``."""
    expert_params = min(shape.expert_params, max(source.n_params - shape.embedding_params, 0))
    layer_params = max(source.n_params - shape.embedding_params - expert_params, 0)
    experts = source.kept_expert_bytes or expert_params * _per_weight(formats.experts, formats)
    layers = layer_params * _per_weight(formats.layers, formats) + experts
    if formats.device == "cpu" and formats.layers == "fp16":
        layers += _fp16_packing_bytes(shape, formats.decode_copy is not None, formats.host.fp16_math)
    if formats.decode_copy:
        layers += layer_params * _per_weight(formats.decode_copy, formats)
    return int(layers + _table_bytes(shape, formats, source.kept_table_bytes) + _output_layer_bytes(shape, formats))


def _per_weight(layer_format: str, formats: FormatPlan) -> float:
    """The bytes a layer weight in ``layer_format`` takes where the plan runs: int4 on Hearth's CPU kernels in their
    own scales (``INT4_KERNEL_BYTES``), elsewhere ``FAST_LAYER_BYTES``."""
    if layer_format == "int4" and formats.device == "cpu" and formats.host.native_kernels:
        return INT4_KERNEL_BYTES
    return FAST_LAYER_BYTES[layer_format]


def _fallback_weight_bytes(source: ModelSource, shape: ModelShape, formats: FormatPlan) -> int:
    """What the quantized transformers fallback holds (see the module docstring): the layers packed, the output
    layer in its format (only where the model has one apart from the table, or ties it: it is packed either way),
    the token table in bf16."""
    layer_params = max(source.n_params - shape.embedding_params, 0)
    per_weight = _per_weight(formats.layers, formats) if formats.layers == "int4" else INT8_BYTES
    table = shape.vocab * shape.hidden * DTYPE_BYTES[formats.token_table]
    return int(layer_params * per_weight + table + _output_layer_bytes(shape, formats))


def _fp16_packing_bytes(shape: ModelShape, prompts_only: bool, fp16_math: bool) -> int:
    """What the layers' fp16 matrices hold on the CPU beyond 2 bytes a weight (``packed_sizes``: FBGEMM's padding,
    or with ``prompts_only``, beside a 4-bit decode copy, an fp32 tail of columns): q/k/v, the attention output and
    gate/up are as wide as the hidden size or the heads, down as the MLP; 0 when those are multiples of 512."""
    qkv_rows, attention_width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim, shape.heads * shape.head_dim
    def extra(rows: int, width: int) -> int:
        return fp16_packed_bytes(rows, width, prompts_only, fp16_math) - 2 * rows * width

    attention = extra(qkv_rows, shape.hidden) + extra(shape.hidden, attention_width)
    mlp = extra(2 * shape.intermediate, shape.hidden) + extra(shape.hidden, shape.intermediate)
    return shape.layers * attention + (shape.layers - shape.moe_layers) * mlp  # experts: at 2 bytes a weight


def _table_bytes(shape: ModelShape, formats: FormatPlan, kept_table: int | None) -> float:
    """``FastLlama``'s token table in the plan's ``token_table`` format: none of its own where it is the int8
    output layer's rows, the file's own blocks (``kept_table`` bytes), two planes of 4-bit groups, or a dtype."""
    weights = shape.vocab * shape.hidden
    if formats.token_table == OUTPUT_ROWS:
        return 0  # the output layer's rows, counted there
    if formats.token_table == "file" and kept_table is not None:
        return kept_table
    if formats.token_table == INT4_PAIR:
        return 2 * weights * INT4_BYTES
    return weights * DTYPE_BYTES[formats.token_table]


def _output_layer_bytes(shape: ModelShape, formats: FormatPlan) -> float:
    """``FastLlama``'s output layer, apart from the table even when the file ties them, in the plan's
    ``output_layer`` format: on the CPU int8 groups (Hearth's kernel), two planes of 4-bit groups, or fp16 as FBGEMM
    packs it; on a GPU the layers' format."""
    weights = shape.vocab * shape.hidden
    if formats.device != "cpu":
        return weights * FAST_LAYER_BYTES[formats.output_layer]
    if formats.output_layer == "int8":
        return int8_bytes(shape.vocab, shape.hidden)
    if formats.output_layer == INT4_PAIR:
        return 2 * weights * INT4_BYTES
    if formats.output_layer == "fp16":
        return fp16_packed_bytes(shape.vocab, shape.hidden, prompts_only=False, fp16_math=False)
    return weights * DTYPE_BYTES[formats.output_layer]


def estimate(source: ModelSource, precision: str, context_length: int, device: str,
             kv_cache: str = "auto") -> MemoryEstimate:
    """Memory to run ``source`` at ``precision`` on ``device`` with a KV cache of ``context_length`` tokens (in
    ``kv_cache``, ``messages.KV_CACHES``), in the formats a load would use (``format_plan.formats_for_source``)."""
    return estimate_formats(source, formats_for_source(source, device, precision, kv_cache=kv_cache), context_length)


def estimate_formats(source: ModelSource, formats: FormatPlan, context_length: int) -> MemoryEstimate:
    """Memory to run ``source`` in ``formats`` with a KV cache of ``context_length`` tokens."""
    shape = model_shape(source.config)
    if formats.fast_path:
        weights = _fast_weight_bytes(source, shape, formats)
    elif formats.quantized_fallback:
        weights = _fallback_weight_bytes(source, shape, formats)
    else:
        weights = estimate_weight_bytes(source.n_params, formats.layers, shape.embedding_params)
        if source.kind == "gguf":
            weights += int(source.n_params * FP32_BYTES)  # transformers' fp32 copy of the whole file
    pool_tokens = -(-context_length // KV_POOL_TOKENS) * KV_POOL_TOKENS
    kv = estimate_kv_bytes(source.config, pool_tokens, KV_VALUE_BYTES[formats.kv_cache])
    overhead = OVERHEAD_FIXED_BYTES + int(OVERHEAD_FRACTION * (weights + kv))
    if formats.quantized_fallback:
        overhead += FALLBACK_RUNTIME_BYTES
    return MemoryEstimate(weights, kv, overhead, weights + kv + overhead)


def fit_verdict(total_bytes: int, available_bytes: int) -> Verdict:
    if total_bytes <= TIGHT_FRACTION * available_bytes:
        return "fits"
    return "tight" if total_bytes <= available_bytes else "won't fit"


def available_memory(device: str) -> int:
    """Bytes free for a model now: free GPU memory for "cuda", available RAM for "cpu"."""
    if device == "cuda":
        import torch

        free_bytes, _total = torch.cuda.mem_get_info()
        return int(free_bytes)
    if device == "cpu":
        return int(psutil.virtual_memory().available)
    raise ValueError(f"unknown device {device!r} (expected 'cpu' or 'cuda')")


def choose_precision(
    source: ModelSource, device: str, context_length: int, available_bytes: int | None = None, kv_cache: str = "auto"
) -> str:
    """The best precision that fits, for ``precision="auto"``.

    On CUDA: bf16, then int8, then int4 (quality first, quantize only to fit). On CPU, for
    a model the fast path loads (``reads_fast``): fp16 (fp32 sums, within rounding of fp32),
    then int4; for any other (transformers): fp32, then bf16, then int4 (the quantized fallback) — most CPUs run
    fp32 matrix products fastest and exactly, bf16 halves memory when fp32 would not fit,
    and 4 bits take a quarter; a GGUF file of such a model goes to the quantized fallback, near the file's size
    (a 4-bit file's blocks in int4, others in int8, then int4), never dequantized to fp32 whole. A precision that "fits" wins over
    one that is only "tight". Raises ``NotEnoughMemoryError`` when none fits.
    """
    if device not in PRECISION_ORDER:
        raise ValueError(f"unknown device {device!r} (expected 'cpu' or 'cuda')")
    available = available_memory(device) if available_bytes is None else available_bytes
    order = precision_order(source, device)
    estimates = {precision: estimate(source, precision, context_length, device, kv_cache) for precision in order}
    verdicts = {precision: fit_verdict(found.total_bytes, available) for precision, found in estimates.items()}
    for wanted in ("fits", "tight"):
        for precision, verdict in verdicts.items():
            if verdict == wanted:
                return precision
    smallest_precision = order[-1]
    smallest = estimates[smallest_precision]
    raise not_enough_memory(source, smallest_precision, smallest, context_length, device, available)


def not_enough_memory(source: ModelSource, precision: str, needed: MemoryEstimate, context_length: int, device: str,
                      available_bytes: int) -> NotEnoughMemoryError:
    """The refusal of ``source`` at ``precision`` (its smallest, under ``auto``) with the figures of ``needed``."""
    even = "even " if precision == precision_order(source, device)[-1] else ""
    return NotEnoughMemoryError(
        f"{source.name} needs about {gib_text(needed.total_bytes)} on {device} {even}at {precision} "
        f"({gib_text(needed.weight_bytes)} weights + {gib_text(needed.kv_bytes)} KV cache for "
        f"{context_length} tokens + {gib_text(needed.overhead_bytes)} overhead), but only "
        f"{gib_text(available_bytes)} is free. Pick a smaller model, a shorter context, or close other programs."
    )


def cpu_formats_notice(source: ModelSource, chosen: FormatPlan, context_length: int, available_bytes: int) -> str | None:
    """For a model the fast path loads on the CPU under ``auto``: which formats were chosen, and why."""
    picked_by_auto = (*FAST_CPU_ORDER, *EIGHT_BIT_CPU_ORDER)
    if not chosen.fast_path or chosen.device != "cpu" or chosen.precision not in picked_by_auto:
        return None
    traits, host = traits_of(source), chosen.host
    fp16 = estimate(source, "fp16", context_length, "cpu").total_bytes
    experts = ", the experts in the file's MXFP4 blocks" if chosen.mxfp4_experts else ""
    if chosen.precision == "fp16":
        copy = f" for prompts and an {chosen.decode_copy} copy for decode steps" if chosen.decode_copy else ""
        return (f"Running fp16 weights{copy}{experts}: {gib_text(fp16)} in all fits comfortably in the "
                f"{gib_text(available_bytes)} free.")
    held = estimate_formats(source, chosen, context_length).total_bytes
    if chosen.precision == "int8":
        return (f"Running from the file's int8 blocks alone{experts} ({gib_text(held)} in all), prompts included: on "
                f"this CPU Hearth's int8 kernel runs its prompts faster so than fp16 weights, which would need "
                f"{gib_text(fp16)}.")
    head = "int8" if chosen.output_layer == "int8" else "two int4 planes, about 8 bits"
    alone = (f"Running from the int4 weights alone ({gib_text(held)} in all; the output layer in {head}), "
             f"prompts included")
    if four_bit_prompts_faster(traits, host):
        why = ("bf16 matrix tiles" if host.amx_tiles else "Hearth's int4 prompt kernel" if host.prompt_kernel
               else "int8 dot products, no fp16 arithmetic")
        return (f"{alone}: on this CPU ({why}) a model this size runs its prompts faster so than from fp16 "
                f"weights, which would need {gib_text(fp16)}.")
    if eight_bit_prompts_faster(traits, host):
        int8 = estimate(source, "int8", context_length, "cpu").total_bytes
        larger = f"the file's int8 blocks would need {gib_text(int8)}"
    else:
        larger = f"fp16 weights for prompts would need {gib_text(fp16)}"
    slower = "" if host.amx_tiles or host.prompt_kernel else ", which makes prompts slower"
    return f"{alone}{slower}: {larger}, more than fits comfortably in the {gib_text(available_bytes)} free."


def gib_text(n_bytes: int) -> str:
    """``n_bytes`` as the messages word it, e.g. "4.46 GiB"."""
    return f"{n_bytes / 1024**3:.2f} GiB"
