"""GGUF files of real model shapes with random weights, for load and speed benchmarks (main thread of a benchmark).

``random-gguf:SHAPE:TYPE`` names one, e.g. ``random-gguf:llama3-8b:q4_k_m``; it is
written once into Hearth's cache folder (``random-gguf/``, never committed) and
reused. Shapes: ``llama3-8b``, ``llama3.1-8b`` (the same, stating Llama 3.1's
131 072-token context), ``qwen2.5-7b``, ``smollm2-1.7b``, ``smollm2-135m``,
``gemma3-1b`` (its 256-wide heads, q/k norms and norms after attention and MLP, the
sliding window in the metadata) and ``phi4-mini`` (fused ``attn_qkv`` and ``ffn_up``,
96 of each head's 128 dimensions turning, LongRoPE's factors as tensors), ``granite3.1-2b``
(Granite's four multipliers in the metadata), ``stablelm2-1.6b`` (StableLM 2: LayerNorms with biases, q/k/v
biases; no fast path, so it loads through the quantized transformers fallback), and the
mixtures of experts ``qwen3-30b-a3b`` (128 experts of which 8 run, each layer's experts
as 3-D tensors the way llama.cpp's converter stacks them) and ``gpt-oss-20b`` (32 experts
of which 4 run, with their biases, attention sinks and YaRN, a window of 128 on every other
layer); ``SHAPE@LAYERS`` cuts a shape to its first LAYERS layers
(``random-gguf:qwen3-30b-a3b@4:q4_k_m``); types ``q4_k_m``, ``q4_0``, ``q4_1``, ``q8_0``,
``mxfp4_moe`` (ggml-org's gpt-oss files: experts in MXFP4, the other matrices in Q8_0), each with llama.cpp's own choice of
block type per tensor (``tensor_type``): Q4_K_M keeps ``output`` (or a tied
``token_embd``) and the ``attn_v`` and ``ffn_down`` of the layers ``use_more_bits``
picks in Q6_K, and a tensor whose rows do not split into 256-weight blocks falls
back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K), as ``llama-quantize`` does; a fused
``attn_qkv`` takes Q5_K in a Q4_K_M file.

The tokenizer metadata is the built-in model's (SmolLM2's 49 152-token BPE), so
both llama.cpp and Hearth can load every file, with its token list padded with
unused tokens (llama.cpp's token type UNUSED: never produced by tokenizing text,
and not special) up to the real model's vocabulary. So the embedding and output
matrices have their real rows too (Phi-4-mini's 200 064, Gemma 3's 262 144): the
output layer is a fifth of such a model's decode step, which a 49 152-row one
hid. Every layer matrix has its real shape.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, TokenType

from engine.bench.random_blocks import random_blocks
from engine.host import paths

PREFIX = "random-gguf:"
FORMAT_VERSION = 2  # 2: the real vocabulary's rows (1: the built-in tokenizer's 49 152)
BUILT_IN_VOCAB = 49152  # SmolLM2's tokens, the tokenizer every file carries
WEIGHT_STD = 0.02
Q = GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    """The hyperparameters a GGUF file states (``{arch}.*`` keys) and its vocabulary's size."""

    arch: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    rope_theta: float
    context: int
    tied: bool
    qkv_bias: bool = False
    head_size: int | None = None  # where it is not hidden / heads (Gemma's)
    rotary_dim: int | None = None  # each head's turning part, where not all of it (Phi-4-mini's)
    sliding_window: int | None = None
    trained_context: int | None = None  # LongRoPE's original context (Phi-4-mini's)
    experts: int = 0  # a mixture of experts' experts per layer, each an MLP of ``expert_ffn`` (0: dense)
    experts_used: int = 0
    expert_ffn: int = 0
    scales: tuple[tuple[str, float], ...] = ()  # float keys of the architecture, e.g. Granite's multipliers
    yarn: tuple[float, int] | None = None  # YaRN's factor and trained context (gpt-oss's)
    norm_bias: bool = False  # LayerNorms with a bias beside each weight (StableLM's)
    vocab: int = BUILT_IN_VOCAB  # the real model's tokens: the embedding's and output's rows

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads


SHAPES = {
    "llama3-8b": Shape("llama", 4096, 14336, 32, 32, 8, 500000.0, 8192, tied=False, vocab=128256),
    "llama3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, 500000.0, 131072, tied=False, vocab=128256),
    "qwen2.5-7b": Shape("qwen2", 3584, 18944, 28, 28, 4, 1000000.0, 32768, tied=False, qkv_bias=True,
                         vocab=152064),
    "smollm2-1.7b": Shape("llama", 2048, 8192, 24, 32, 32, 130000.0, 8192, tied=True),
    "smollm2-135m": Shape("llama", 576, 1536, 30, 9, 3, 100000.0, 8192, tied=True),
    "gemma3-1b": Shape("gemma3", 1152, 6912, 26, 4, 1, 1000000.0, 32768, tied=True, head_size=256,
                       sliding_window=512, vocab=262144),
    "gemma3-4b": Shape("gemma3", 2560, 10240, 34, 8, 4, 1000000.0, 131072, tied=True, head_size=256,
                       sliding_window=1024, vocab=262208),
    "phi4-mini": Shape("phi3", 3072, 8192, 32, 24, 8, 10000.0, 131072, tied=True, rotary_dim=96,
                       sliding_window=262144, trained_context=4096, vocab=200064),
    "granite3.1-2b": Shape("granite", 2048, 8192, 40, 32, 8, 5000000.0, 131072, tied=True,
                           scales=(("embedding_scale", 12.0), ("residual_scale", 0.22),
                                   ("attention.scale", 0.015625), ("logit_scale", 8.0)), vocab=49155),
    "stablelm2-1.6b": Shape("stablelm", 2048, 5632, 24, 32, 32, 10000.0, 4096, tied=False, qkv_bias=True,
                            rotary_dim=16, norm_bias=True, vocab=100352),
}
LONGROPE_ATTENTION_FACTOR = 1.190238  # sqrt(1 + ln(131072 / 4096) / ln(4096)), as the converter writes it
MOE_SHAPES = {  # GGUF alone (``random_hf`` writes dense checkpoints)
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 6144, 48, 32, 4, 1000000.0, 40960, tied=False, head_size=128,
                           experts=128, experts_used=8, expert_ffn=768, vocab=151936),
    "gpt-oss-20b": Shape("gpt-oss", 2880, 2880, 24, 64, 8, 150000.0, 131072, tied=False, qkv_bias=True,
                         head_size=64, sliding_window=128, experts=32, experts_used=4, expert_ffn=2880,
                         yarn=(32.0, 4096), vocab=201088),
}
LAYERS_MARK = "@"
FILE_TYPES = {  # name: (llama.cpp's file type, the block type of most tensors)
    "q4_k_m": (LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    "q4_0": (LlamaFileType.MOSTLY_Q4_0, Q.Q4_0),
    "q4_1": (LlamaFileType.MOSTLY_Q4_1, Q.Q4_1),
    "q8_0": (LlamaFileType.MOSTLY_Q8_0, Q.Q8_0),
    "mxfp4_moe": (LlamaFileType.MOSTLY_MXFP4_MOE, Q.Q8_0),
}
EXPERT_TYPES = {"mxfp4_moe": Q.MXFP4}  # a file type whose experts take a block type of their own
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}  # llama-quantize's, for rows that 256-weight blocks do not split


class RandomGgufError(ValueError):
    """A ``random-gguf:`` name that does not say a known shape and type; the message lists them."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    rows: int
    cols: int  # weights per row (GGUF's ne[0])
    qtype: GGMLQuantizationType  # F32 for norms, biases and routers
    experts: int = 0  # a 3-D tensor of this many [rows, cols] matrices, one per expert (0: one matrix)


def is_random_gguf(model: str) -> bool:
    return model.startswith(PREFIX)


def parse(model: str) -> tuple[str, str]:
    """``random-gguf:SHAPE[@LAYERS]:TYPE`` as (shape with its layers, type), checked; TYPE in either case
    (llama.cpp writes ``Q4_K_M``)."""
    name, _, spelled = model[len(PREFIX):].partition(":")
    kind = spelled.lower()
    base, _, layers = name.partition(LAYERS_MARK)
    if base not in {**SHAPES, **MOE_SHAPES} or kind not in FILE_TYPES or (layers and not layers.isdigit()):
        raise RandomGgufError(f"{model!r} is not a random-gguf model; write {PREFIX}SHAPE:TYPE or "
                              f"{PREFIX}SHAPE{LAYERS_MARK}LAYERS:TYPE with SHAPE one of "
                              f"{', '.join([*SHAPES, *MOE_SHAPES])} and TYPE one of {', '.join(FILE_TYPES)}.")
    return name, kind


def shape_of(name: str) -> Shape:
    """The ``Shape`` a checked ``SHAPE[@LAYERS]`` names: its first LAYERS layers where it says so."""
    base, _, layers = name.partition(LAYERS_MARK)
    shape = {**SHAPES, **MOE_SHAPES}[base]
    return replace(shape, layers=int(layers)) if layers else shape


def parse_spec(model: str, prefix: str, label: str, kinds: Iterable[str], error: type[ValueError],
               shapes: Iterable[str] = SHAPES) -> tuple[str, str]:
    """``PREFIX:SHAPE:KIND`` as (shape, kind), each checked against the known ones (``error`` lists them)."""
    shape, _, kind = model[len(prefix):].partition(":")
    if shape not in shapes or kind not in kinds:
        raise error(f"{model!r} is not a {prefix[:-1]} model; write {prefix}SHAPE:{label} with SHAPE one of "
                    f"{', '.join(shapes)} and {label} one of {', '.join(kinds)}.")
    return shape, kind


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose ``attn_v`` and ``ffn_down`` a Q4_K_M file keeps in 6 bits."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(role: str, layer: int, cols: int, shape: Shape, ftype: str) -> GGMLQuantizationType:
    """The block type ``llama-quantize`` gives one 2-D tensor of this file type."""
    base = FILE_TYPES[ftype][1]
    if role == "output" or (role == "token_embd" and shape.tied):
        return Q.Q8_0 if base == Q.Q8_0 or cols % 256 else Q.Q6_K
    wanted = Q.Q5_K if ftype == "q4_k_m" and role == "attn_qkv" else base
    if ftype == "q4_k_m" and role in ("attn_v", "ffn_down") and use_more_bits(layer, shape.layers):
        wanted = Q.Q6_K
    return FALLBACK[wanted] if wanted in FALLBACK and cols % 256 else wanted


def tensor_specs(shape: Shape, ftype: str) -> list[TensorSpec]:
    """Every tensor of the file in llama.cpp's names, in the order ``convert_hf_to_gguf`` writes them."""
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def weight(role: str, layer: int, rows: int, cols: int, name: str, experts: int = 0) -> TensorSpec:
        if experts and ftype in EXPERT_TYPES:
            return TensorSpec(name, rows, cols, EXPERT_TYPES[ftype], experts)
        return TensorSpec(name, rows, cols, tensor_type(role, layer, cols, shape, ftype), experts)

    specs = [weight("token_embd", -1, shape.vocab, shape.hidden, "token_embd.weight")]
    if shape.trained_context:
        specs += [TensorSpec(f"rope_factors_{kind}.weight", 1, shape.rotary_dim // 2, Q.F32) for kind in ("long", "short")]
    for i in range(shape.layers):
        if shape.arch == "phi3":
            matrices = (("attn_qkv", q_rows + 2 * kv_rows, shape.hidden), ("attn_output", shape.hidden, q_rows))
        else:
            matrices = (("attn_q", q_rows, shape.hidden), ("attn_k", kv_rows, shape.hidden),
                        ("attn_v", kv_rows, shape.hidden), ("attn_output", shape.hidden, q_rows))
        specs.append(TensorSpec(f"blk.{i}.attn_norm.weight", 1, shape.hidden, Q.F32))
        specs += [weight(role, i, rows, cols, f"blk.{i}.{role}.weight") for role, rows, cols in matrices]
        if shape.qkv_bias:
            specs += [TensorSpec(f"blk.{i}.{role}.bias", 1, rows, Q.F32)
                      for role, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows))]
        norms = [("ffn_norm", shape.hidden)]
        if shape.arch == "gpt-oss":  # the output's bias, the sinks; its MLP's input norm is post_attention_norm
            specs += [TensorSpec(f"blk.{i}.attn_output.bias", 1, shape.hidden, Q.F32),
                      TensorSpec(f"blk.{i}.attn_sinks.weight", 1, shape.heads, Q.F32)]
            norms = [("post_attention_norm", shape.hidden)]
        if shape.arch.startswith("qwen3"):
            norms += [("attn_q_norm", shape.head_dim), ("attn_k_norm", shape.head_dim)]
        if shape.arch == "gemma3":  # q/k norms, and norms of the attention's and the MLP's outputs
            norms += [("attn_q_norm", shape.head_dim), ("attn_k_norm", shape.head_dim),
                      ("post_attention_norm", shape.hidden), ("post_ffw_norm", shape.hidden)]
        specs += [TensorSpec(f"blk.{i}.{name}.weight", 1, size, Q.F32) for name, size in norms]
        specs += _norm_biases(shape, [(f"blk.{i}.attn_norm", shape.hidden), *((f"blk.{i}.{n}", k) for n, k in norms)])
        specs += _mlp_specs(shape, i, weight)
    specs.append(TensorSpec("output_norm.weight", 1, shape.hidden, Q.F32))
    specs += _norm_biases(shape, [("output_norm", shape.hidden)])
    if not shape.tied:
        specs.append(weight("output", -1, shape.vocab, shape.hidden, "output.weight"))
    return specs


def _norm_biases(shape: Shape, norms: list[tuple[str, int]]) -> list[TensorSpec]:
    """The biases of ``norms`` (name without ``.weight``, size) where the shape's LayerNorms have them."""
    return [TensorSpec(f"{name}.bias", 1, size, Q.F32) for name, size in norms] if shape.norm_bias else []


def _mlp_specs(shape: Shape, layer: int, weight: Callable[..., TensorSpec]) -> list[TensorSpec]:
    """A layer's MLP: gate, up and down; or a mixture's router (F32, which llama-quantize leaves alone) and its
    experts' gate, up and down stacked into 3-D tensors, the down ones in 6 bits where a dense ``ffn_down`` is."""
    if shape.arch == "phi3":  # gate and up fused, gate's rows first
        return [weight(role, layer, rows, cols, f"blk.{layer}.{role}.weight") for role, rows, cols in
                (("ffn_up", 2 * shape.ffn, shape.hidden), ("ffn_down", shape.hidden, shape.ffn))]
    if not shape.experts:
        return [weight(role, layer, rows, cols, f"blk.{layer}.{role}.weight") for role, rows, cols in
                (("ffn_gate", shape.ffn, shape.hidden), ("ffn_up", shape.ffn, shape.hidden),
                 ("ffn_down", shape.hidden, shape.ffn))]
    experts, width = shape.experts, shape.expert_ffn
    router = TensorSpec(f"blk.{layer}.ffn_gate_inp.weight", experts, shape.hidden, Q.F32)
    matrices = (("ffn_gate", width, shape.hidden), ("ffn_up", width, shape.hidden), ("ffn_down", shape.hidden, width))
    specs = [router] + [weight(role, layer, rows, cols, f"blk.{layer}.{role}_exps.weight", experts)
                        for role, rows, cols in matrices]
    if shape.arch == "gpt-oss":  # the router's bias [E] and each expert's biases, [E, rows] each
        specs += [TensorSpec(f"blk.{layer}.ffn_gate_inp.bias", 1, experts, Q.F32)]
        specs += [TensorSpec(f"blk.{layer}.{role}_exps.bias", experts, rows, Q.F32) for role, rows, _ in matrices]
    return specs


def random_gguf_path(model: str) -> Path:
    shape, ftype = parse(model)
    return paths.models_dir() / "random-gguf" / f"{shape}-{ftype}-v{FORMAT_VERSION}.gguf"


def ensure_random_gguf(model: str, tokenizer_source: Path) -> Path:
    """The file ``model`` names, written first if it is not there yet."""
    return written_once(random_gguf_path(model), lambda staging: write_random_gguf(staging, *parse(model), tokenizer_source))


def written_once(target: Path, write: Callable[[Path], None]) -> Path:
    """``target`` as it is, or first written by ``write`` under a temporary name beside it, then renamed (a file
    or a folder: an interrupted write leaves no half-written model behind)."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        write(staging)
        staging.rename(target)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
    return target


def write_random_gguf(path: Path, shape_name: str, ftype: str, tokenizer_source: Path, seed: int = 0) -> None:
    """Write the file tensor by tensor, so memory holds one tensor at a time."""
    shape = shape_of(shape_name)
    tokenizer_fields = padded_tokens(_tokenizer_fields(tokenizer_source), shape.vocab)
    specs = tensor_specs(shape, ftype)
    writer = GGUFWriter(path, shape.arch)
    _add_metadata(writer, shape, shape_name, ftype, tokenizer_fields)
    for spec in specs:
        writer.add_tensor_info(spec.name, *_stored_shape(spec), raw_dtype=spec.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for spec in specs:
        writer.write_tensor_data(_tensor_data(spec, rng))
    writer.close()


def _stored_shape(spec: TensorSpec) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, bytes) as ``add_tensor_info`` takes them: bytes per row for a quantized tensor, an expert
    tensor's experts first."""
    experts = (spec.experts,) if spec.experts else ()
    if spec.qtype == Q.F32:
        rows = (spec.rows,) if spec.rows > 1 else ()
        return (*rows, spec.cols), np.dtype(np.float32), spec.rows * spec.cols * 4
    block_size, type_size = GGML_QUANT_SIZES[spec.qtype]
    row_bytes = spec.cols // block_size * type_size
    return (*experts, spec.rows, row_bytes), np.dtype(np.uint8), max(spec.experts, 1) * spec.rows * row_bytes


def _tensor_data(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.name.endswith("norm.weight") or spec.name.startswith("rope_factors"):
        return np.ones(spec.cols, dtype=np.float32)  # [hidden], [rotary / 2]: a norm's weight, LongRoPE's divisors
    if spec.qtype == Q.F32:  # a bias, or a router [E, hidden]
        size = (spec.rows, spec.cols) if spec.rows > 1 else spec.cols
        return rng.normal(0.0, WEIGHT_STD, size=size).astype(np.float32)
    blocks = random_blocks(spec.qtype, max(spec.experts, 1) * spec.rows, spec.cols, WEIGHT_STD, rng)
    return blocks.reshape(spec.experts, spec.rows, -1) if spec.experts else blocks  # [(E,) rows, row bytes]


def _tokenizer_fields(source: Path) -> dict[str, tuple[object, list[GGUFValueType]]]:
    """Every ``tokenizer.*`` key of ``source`` as (value, value types)."""
    reader = GGUFReader(source)
    return {key: (field.contents(), field.types) for key, field in reader.fields.items() if key.startswith("tokenizer.")}


def padded_tokens(fields: dict[str, tuple[object, list[GGUFValueType]]], vocab: int,
                  ) -> dict[str, tuple[object, list[GGUFValueType]]]:
    """``fields`` with the token list and its types padded to ``vocab`` tokens with unused ones
    (``<|unused_N|>``, type UNUSED); a vocabulary smaller than the tokenizer's is refused."""
    tokens, token_types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    padding = vocab - len(tokens[0])
    if padding < 0:
        raise ValueError(f"a vocabulary of {vocab} tokens cannot hold the tokenizer's {len(tokens[0])}")
    names = [f"<|unused_{i}|>" for i in range(len(tokens[0]), vocab)]
    return {**fields, "tokenizer.ggml.tokens": ([*tokens[0], *names], tokens[1]),
            "tokenizer.ggml.token_type": ([*token_types[0], *[int(TokenType.UNUSED)] * padding], token_types[1])}


def _add_metadata(writer: GGUFWriter, shape: Shape, shape_name: str, ftype: str,
                  tokenizer_fields: dict[str, tuple[object, list[GGUFValueType]]]) -> None:
    arch = shape.arch
    writer.add_name(f"random {shape_name} {ftype}")
    writer.add_uint32("general.file_type", int(FILE_TYPES[ftype][0]))
    writer.add_uint32("general.quantization_version", 2)
    for key, value in (("context_length", shape.context), ("embedding_length", shape.hidden),
                       ("block_count", shape.layers), ("feed_forward_length", shape.ffn),
                       ("attention.head_count", shape.heads), ("attention.head_count_kv", shape.kv_heads),
                       ("vocab_size", shape.vocab), ("rope.dimension_count", shape.rotary_dim or shape.head_dim)):
        writer.add_uint32(f"{arch}.{key}", value)
    if shape.head_size:
        writer.add_uint32(f"{arch}.attention.key_length", shape.head_size)
        writer.add_uint32(f"{arch}.attention.value_length", shape.head_size)
    if shape.sliding_window:
        writer.add_uint32(f"{arch}.attention.sliding_window", shape.sliding_window)
    if shape.trained_context:
        writer.add_uint32(f"{arch}.rope.scaling.original_context_length", shape.trained_context)
        writer.add_float32(f"{arch}.rope.scaling.attn_factor", LONGROPE_ATTENTION_FACTOR)
    if shape.yarn:
        writer.add_string(f"{arch}.rope.scaling.type", "yarn")
        writer.add_float32(f"{arch}.rope.scaling.factor", shape.yarn[0])
        writer.add_uint32(f"{arch}.rope.scaling.original_context_length", shape.yarn[1])
    if shape.experts:
        for key, value in (("expert_count", shape.experts), ("expert_used_count", shape.experts_used),
                           ("expert_feed_forward_length", shape.expert_ffn)):
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for key, value in shape.scales:
        writer.add_float32(f"{arch}.{key}", value)
    for key, (value, types) in tokenizer_fields.items():
        sub_type = types[-1] if types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, types[0], sub_type=sub_type)
