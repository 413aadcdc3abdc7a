"""How much memory a model will need, and which precision fits (engine thread).

Estimates are arithmetic on the checked ``ModelSource``: the exact parameter count
(from safetensors headers or the GGUF tensor table) and the shape in its config.
torch is imported only by ``available_memory("cuda")``.

* Weights: parameters × bytes per parameter of the precision. Under int8 and nf4,
  bitsandbytes quantizes only the linear layers; the token embeddings and the
  output head stay in 16-bit, and are counted so.
* A model the fast path loads into its own formats, a GGUF file it reads directly
  (``gguf_direct``) or a safetensors folder of an architecture it runs (``fast_scope``,
  streamed by ``safetensors_state``), is counted as ``FastLlama`` holds it: its layers in the precision's format (4-bit: groups of 32,
  ``DECODE_COPY_BYTES`` per weight; fp16 on the CPU as FBGEMM packs it, ``packed_sizes``), fp16 on the CPU keeping a 4-bit copy of a 4-bit
  file's layers for decode steps (``loading.decode_format``), and the token table and
  the output layer apart even when the file ties them (on the CPU fp16, the output
  layer in int8 groups beside 4-bit layers, alone or a decode copy, where Hearth's kernels
  run, else two planes of 4-bit groups beside 4-bit layers alone, ``quant_int.INT4_PAIR``). Its tensors
  are read one at a time, so the load holds no more than that and one tensor on its way.
  On the CPU ``auto`` picks fp16 (with that copy) where it fits comfortably, else 4-bit alone;
  a 4-bit file runs 4-bit alone on a CPU with AMX's bf16 tiles, whatever its size, and from
  1B parameters on one whose int8 dot products beat its fp16 arithmetic
  (``FOUR_BIT_PROMPT_PARAMS``): there its prompts run faster from the 4-bit weights.
* Any other GGUF file goes through transformers, which dequantizes every tensor into
  fp32 before the model takes them: ``FP32_BYTES`` per parameter more while it loads.
* KV cache: 2 (keys and values) × layers × KV heads × head size × context × bytes (fp32 on the
  CPU fast path, which computes in fp32 whatever its weights' format).
* Overhead: activations, allocator slack and the runtime itself, taken as
  ``OVERHEAD_FIXED_BYTES`` plus ``OVERHEAD_FRACTION`` of weights and KV cache.

``fit_verdict`` says "fits" when the total is at most ``TIGHT_FRACTION`` (85 %) of the
available memory, "tight" up to 100 %, and "won't fit" beyond.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from engine.forward.fast_scope import config_view, unsupported_reason
from engine.forward.native.support import may_run
from engine.forward.weights.packed_sizes import fp16_packed_bytes, int8_bytes, int8_kernel_takes
from engine.host.cpu_features import has_amx_tiles, has_fp16_math, has_int8_dot
from engine.models.gguf_check import DIRECT_ARCHITECTURES
from engine.models.model_source import ModelFileError, ModelSource

Verdict = Literal["fits", "tight", "won't fit"]

BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "nf4": 0.5 + 4 / 64}  # nf4: fp32 scale per 64
QUANTIZED_PRECISIONS = ("int8", "nf4")
UNQUANTIZED_BYTES = 2.0  # embeddings and output head under int8/nf4 stay in bf16
DECODE_COPY_BYTES = 0.5 + 4 / 32  # 4 bits, and a bf16 scale and zero point per 32 weights
PRECISION_ORDER = {"cuda": ("bf16", "int8", "nf4"), "cpu": ("fp32", "bf16", "nf4")}
FAST_CPU_ORDER = ("fp16", "nf4")  # the fast path's formats: fp16 (+ a 4-bit decode copy), 4-bit alone
FOUR_BIT_PROMPT_PARAMS = 1_000_000_000
"""From this many parameters a 4-bit file's prompts run faster from its 4-bit weights (``int4_prompts``: int8 GEMMs)
than from an fp16 copy, on a CPU with int8 dot products and no fp16 arithmetic (``cpu_features``), so ``auto``
keeps the 4-bit weights alone whatever memory allows. 2-core Zen 4, 512-token prompts against llama.cpp in the same
runs: SmolLM2-1.7B's Q4_K_M 56.2 tok/s (llama.cpp 62.5) against 40.4 (57.4) with the copy, decode level (61-65 ms a
step in both), holding 1.7 GB against 5.2; SmolLM2-135M's prompts 521 against 589, so small models keep the copy."""
FAST_LAYER_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "nf4": DECODE_COPY_BYTES}
FP32_BYTES = 4.0
FAST_CPU_PRECISIONS = ("fp32", "fp16", "nf4")  # the CPU fast path's (quant_int.CPU_FORMATS); bf16 goes to transformers
TIGHT_FRACTION = 0.85
OVERHEAD_FIXED_BYTES = 256 * 1024**2
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

    @property
    def embedding_params(self) -> int:
        """Parameters of the token embeddings and output head (one matrix if tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


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
            tied_embeddings=bool(config.get("tied_embeddings", True)),
        )
    config = config.get("text_config") or config
    hidden = _required(config, HF_SHAPE_KEYS["hidden"], "hidden size")
    heads = _required(config, HF_SHAPE_KEYS["heads"], "number of attention heads")
    return ModelShape(
        layers=_required(config, HF_SHAPE_KEYS["layers"], "number of layers"), hidden=hidden, heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab=config.get("vocab_size") or 0,
        intermediate=config.get("intermediate_size") or config.get("n_inner") or 4 * hidden,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def params_from_config(config: Mapping[str, Any]) -> int:
    """Parameter count of a Llama-style decoder from its shape alone (no biases).

    Use it when no weights are at hand (e.g. to size a model before downloading);
    ``ModelSource.n_params`` is exact and preferred when there is a source.
    """
    shape = model_shape(config)
    attention = shape.hidden * shape.head_dim * (2 * shape.heads + 2 * shape.kv_heads)  # q, o, k, v
    mlp = 3 * shape.hidden * shape.intermediate  # gate, up, down
    norms = 2 * shape.hidden
    return shape.layers * (attention + mlp + norms) + shape.embedding_params + shape.hidden


def estimate_weight_bytes(n_params: int, precision: str, unquantized_params: int = 0) -> int:
    """Bytes of weights at ``precision``; ``unquantized_params`` stay 16-bit under int8/nf4."""
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(BYTES_PER_PARAM)})")
    if precision not in QUANTIZED_PRECISIONS:
        return int(n_params * BYTES_PER_PARAM[precision])
    quantized = max(n_params - unquantized_params, 0)
    return int(quantized * BYTES_PER_PARAM[precision] + unquantized_params * UNQUANTIZED_BYTES)


def estimate_kv_bytes(config_like: Mapping[str, Any], context_length: int, dtype_bytes: int) -> int:
    """KV cache bytes for ``context_length`` tokens: 2 × layers × kv_heads × head_dim × context × bytes."""
    shape = model_shape(config_like)
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * context_length * dtype_bytes


def is_direct_gguf(source: ModelSource) -> bool:
    """A GGUF file the fast path reads as it is (``gguf_direct``), not through transformers."""
    return source.kind == "gguf" and source.config.get("architecture") in DIRECT_ARCHITECTURES


def reads_fast(source: ModelSource) -> bool:
    """Whether the fast path loads ``source`` into its own formats: a GGUF file it reads directly, or a
    safetensors folder of an architecture it runs."""
    if source.kind == "gguf":
        return is_direct_gguf(source)
    return unsupported_reason(config_view(source.config)) is None


def precision_order(source: ModelSource, device: str) -> tuple[str, ...]:
    """The precisions ``auto`` tries on ``device``, best first."""
    if device == "cpu" and reads_fast(source):
        return ("nf4",) if four_bit_prompts_faster(source) else FAST_CPU_ORDER
    return PRECISION_ORDER[device]


def four_bit_prompts_faster(source: ModelSource) -> bool:
    """Whether this CPU runs ``source``'s prompts faster from its 4-bit weights than from an fp16 copy: any size
    with AMX's bf16 tiles (``native.int4_matmul``), from ``FOUR_BIT_PROMPT_PARAMS`` with int8 dot products and no fp16
    arithmetic."""
    if not source.four_bit_layers:
        return False
    if has_amx_tiles() and may_run():
        return True
    return source.n_params >= FOUR_BIT_PROMPT_PARAMS and has_int8_dot() and not has_fp16_math()


def _fast_weight_bytes(source: ModelSource, shape: ModelShape, precision: str, device: str) -> int:
    """What ``FastLlama`` holds for a model it loads into its own formats (see the module docstring)."""
    layer_params = max(source.n_params - shape.embedding_params, 0)
    layers = layer_params * FAST_LAYER_BYTES.get(precision, BYTES_PER_PARAM[precision])
    if device == "cpu" and precision == "fp16":
        layers += _fp16_packing_bytes(shape, prompts_only=source.four_bit_layers)
        layers += layer_params * DECODE_COPY_BYTES if source.four_bit_layers else 0
    head_in_int8 = _head_in_int8(source, shape, precision, device)
    return int(layers + _table_and_head_bytes(shape, precision, device, source.kept_table_bytes, head_in_int8))


def _head_in_int8(source: ModelSource, shape: ModelShape, precision: str, device: str) -> bool:
    """Whether the output layer runs on Hearth's int8 kernel: on the CPU beside 4-bit layers, alone or a decode copy
    (``fast_llama.head_format``)."""
    beside_four_bit = precision == "nf4" or precision == "fp16" and source.four_bit_layers
    return beside_four_bit and device == "cpu" and may_run() and int8_kernel_takes(shape.vocab, shape.hidden)


def _fp16_packing_bytes(shape: ModelShape, prompts_only: bool) -> int:
    """What the layers' fp16 matrices hold on the CPU beyond 2 bytes a weight (``packed_sizes``: FBGEMM's padding,
    or with ``prompts_only``, beside a 4-bit decode copy, an fp32 tail of columns): q/k/v, the attention output and
    gate/up are as wide as the hidden size or the heads, down as the MLP; 0 when those are multiples of 512."""
    qkv_rows, attention_width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim, shape.heads * shape.head_dim
    matrices = ((qkv_rows, shape.hidden), (shape.hidden, attention_width), (2 * shape.intermediate, shape.hidden),
                (shape.hidden, shape.intermediate))
    extra = (fp16_packed_bytes(rows, width, prompts_only, has_fp16_math()) - 2 * rows * width for rows, width in matrices)
    return shape.layers * sum(extra)


def _table_and_head_bytes(shape: ModelShape, precision: str, device: str, kept_table: int | None,
                          head_in_int8: bool) -> float:
    """``FastLlama`` keeps the token table and the output layer apart, even when the file ties them. On the CPU the
    output layer in int8 groups beside 4-bit layers (alone or a decode copy) where Hearth's kernels run
    (``head_in_int8``), else in two planes of 4-bit groups at nf4, fp32 at fp32 and fp16 as FBGEMM packs it at
    fp16; the table in the file's own blocks where it has quantized ones (``kept_table`` bytes,
    ``gguf_blocks.BlockTable``), else in two planes at nf4, fp32 at fp32 and fp16 at fp16. On a GPU the table in
    the compute dtype and the output layer in the layers' format (``fast_llama.head_format``)."""
    table = shape.vocab * shape.hidden
    if device != "cpu":
        table_bytes = UNQUANTIZED_BYTES if precision in QUANTIZED_PRECISIONS else BYTES_PER_PARAM[precision]
        return table * (table_bytes + FAST_LAYER_BYTES[precision])
    pair = 2 * table * DECODE_COPY_BYTES
    own_table = {"nf4": pair, "fp32": BYTES_PER_PARAM["fp32"] * table}.get(precision, table * UNQUANTIZED_BYTES)
    if head_in_int8:
        head_bytes = int8_bytes(shape.vocab, shape.hidden)
    elif precision in ("nf4", "fp32"):
        head_bytes = own_table  # the same planes, or fp32, as the table's own
    else:
        head_bytes = fp16_packed_bytes(shape.vocab, shape.hidden, prompts_only=False, fp16_math=False)
    return (kept_table or own_table) + head_bytes


def estimate(source: ModelSource, precision: str, context_length: int, device: str) -> MemoryEstimate:
    """Memory to run ``source`` at ``precision`` on ``device`` with a KV cache of ``context_length`` tokens."""
    shape = model_shape(source.config)
    fast = reads_fast(source) and (device == "cuda" or precision in FAST_CPU_PRECISIONS)
    if fast:
        weights = _fast_weight_bytes(source, shape, precision, device)
    else:
        weights = estimate_weight_bytes(source.n_params, precision, shape.embedding_params)
        if source.kind == "gguf":
            weights += int(source.n_params * FP32_BYTES)  # transformers' fp32 copy of the whole file
    fp32_cache = precision == "fp32" or (fast and device == "cpu")  # the CPU fast path computes in fp32
    kv = estimate_kv_bytes(source.config, context_length, 4 if fp32_cache else 2)
    overhead = OVERHEAD_FIXED_BYTES + int(OVERHEAD_FRACTION * (weights + kv))
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
    source: ModelSource, device: str, context_length: int, available_bytes: int | None = None
) -> str:
    """The best precision that fits, for ``precision="auto"``.

    On CUDA: bf16, then int8, then nf4 (quality first, quantize only to fit). On CPU, for
    a model the fast path loads (``reads_fast``): fp16 (fp32 sums, within rounding of fp32),
    then 4 bits; for any other (transformers): fp32, then bf16, then nf4 — most CPUs run
    fp32 matrix products fastest and exactly, bf16 halves memory when fp32 would not fit,
    and 4 bits take a quarter. A precision that "fits" wins over
    one that is only "tight". Raises ``NotEnoughMemoryError`` when none fits.
    """
    if device not in PRECISION_ORDER:
        raise ValueError(f"unknown device {device!r} (expected 'cpu' or 'cuda')")
    available = available_memory(device) if available_bytes is None else available_bytes
    order = precision_order(source, device)
    estimates = {precision: estimate(source, precision, context_length, device) for precision in order}
    verdicts = {precision: fit_verdict(found.total_bytes, available) for precision, found in estimates.items()}
    for wanted in ("fits", "tight"):
        for precision, verdict in verdicts.items():
            if verdict == wanted:
                return precision
    smallest_precision = order[-1]
    smallest = estimates[smallest_precision]
    raise NotEnoughMemoryError(
        f"{source.name} needs about {_gib(smallest.total_bytes)} on {device} even at {smallest_precision} "
        f"({_gib(smallest.weight_bytes)} weights + {_gib(smallest.kv_bytes)} KV cache for "
        f"{context_length} tokens + {_gib(smallest.overhead_bytes)} overhead), but only "
        f"{_gib(available)} is free. Pick a smaller model, a shorter context, or close other programs."
    )


def cpu_formats_notice(source: ModelSource, chosen: str, context_length: int, available_bytes: int) -> str | None:
    """For a model the fast path loads on the CPU under ``auto``: which formats were chosen, and why."""
    if not reads_fast(source) or chosen not in FAST_CPU_ORDER:
        return None
    fp16 = estimate(source, "fp16", context_length, "cpu").total_bytes
    if chosen == "fp16":
        copy = " for prompts and a 4-bit copy for decode steps" if source.four_bit_layers else ""
        return f"Running fp16 weights{copy}: {_gib(fp16)} in all fits comfortably in the {_gib(available_bytes)} free."
    four_bit = estimate(source, "nf4", context_length, "cpu").total_bytes
    in_int8 = _head_in_int8(source, model_shape(source.config), "nf4", "cpu")
    head = "int8" if in_int8 else "two 4-bit planes, about 8 bits"
    alone = (f"Running from the 4-bit weights alone ({_gib(four_bit)} in all; the output layer in {head}), "
             f"prompts included")
    if four_bit_prompts_faster(source):
        why = "bf16 matrix tiles" if has_amx_tiles() else "int8 dot products, no fp16 arithmetic"
        return (f"{alone}: on this CPU ({why}) a model this size runs its prompts faster so than from fp16 "
                f"weights, which would need {_gib(fp16)}.")
    return (f"{alone}, which makes prompts slower: fp16 weights for prompts would need {_gib(fp16)}, more than fits "
            f"comfortably in the {_gib(available_bytes)} free.")


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 1024**3:.2f} GiB"
