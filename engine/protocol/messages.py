"""What crosses the queue between the GUI (or CLI) and the engine thread.

Only frozen dataclasses of text and numbers live here: no tensors, no Qt objects.
Requests travel into the engine thread; events travel out of it. This module is
imported on every thread and imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["eos", "stop_string", "constraint", "max_tokens", "context_full", "cancelled", "error"]
"""``constraint``: the request's ``Constraint`` was complete, so the reply could say nothing more."""
OverflowPolicy = Literal["drop_oldest", "stop"]
EngineState = Literal["idle", "fetching", "loading", "ready", "generating", "error"]


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made: ``arguments`` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation as the model sees it.

    An assistant turn may carry the ``tool_calls`` it made; a ``"tool"`` turn is a call's result, naming the
    call it answers (``tool_call_id``) and the function (``name``).
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: each token's log-probability and its k likeliest rivals (k <= 20)
    speculative: bool = True  # draft tokens from the conversation where that pays (``engine/chat/speculative``)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8", "int4")
"""``int4``: 4 bits a weight; on the fast path asymmetric groups (a scale and zero each), through transformers
bitsandbytes' NF4 (``engine.models.format_plan``)."""
KV_CACHES = ("auto", "bf16", "int8")  # the KV cache's precisions a load may ask for (``LoadOptions.kv_cache``)
LEGACY_PRECISIONS = {"nf4": "int4"}  # what earlier versions called the 4-bit precision


def canonical_precision(name: str) -> str:
    """``name`` as ``PRECISIONS`` has it: a command line or request of an earlier version may say ``nf4``."""
    return LEGACY_PRECISIONS.get(name, name)


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: ``device`` one of ``DEVICES``, ``precision`` one of ``PRECISIONS`` (or a
    ``LEGACY_PRECISIONS`` name, read as its ``canonical_precision``), ``kv_cache`` one of ``KV_CACHES``: "auto"
    (bf16 on the CPU), "bf16", or "int8" (a code a value and a scale per 32, half the memory; the CPU only).
    ``draft_model``: a small model with the same tokenizer that drafts tokens for this one to verify ("default" for
    the built-in model, a folder or a .gguf file; None for none)."""

    device: str = "auto"
    precision: str = "auto"
    context_length: int | None = None
    kv_cache: str = "auto"
    draft_model: str | None = None


@dataclass(frozen=True)
class RemoteServer:
    """An OpenAI-compatible server, ``http://host:8000``; ``api_key`` ("" for none) never shows in a repr."""

    base_url: str
    api_key: str = field(default="", repr=False)


# ---------------------------------------------------------------- requests


CONSTRAINT_KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraint:
    """What the reply must match, token by token: ``kind`` one of ``CONSTRAINT_KINDS``.

    ``spec``: "" for ``json_object`` (any JSON object), the schema as JSON text for ``json_schema``, the pattern for
    ``regex``, a JSON list of strings for ``choice`` (the reply is one of them), a llguidance Lark grammar for
    ``grammar``.
    """

    kind: str
    spec: str = ""


@dataclass(frozen=True)
class LoadModel:
    """Load ``path`` ("default" for the built-in model, a folder or a .gguf file).

    With ``server``, ``path`` is a model's id there: the server must list it, and replies are asked of it.
    """

    request_id: str
    path: str
    options: LoadOptions = LoadOptions()
    server: RemoteServer | None = None


@dataclass(frozen=True)
class Generate:
    """Reply to the last user message of ``messages`` in conversation ``conversation_id``.

    With ``prompt`` set, the model continues that raw text instead: no chat template,
    ``messages`` is ignored (the API server's ``/v1/completions``).
    """

    request_id: str
    conversation_id: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = SamplingParams()
    overflow: OverflowPolicy = "drop_oldest"
    prompt: str | None = None
    constraint: Constraint | None = None
    tools: tuple[str, ...] = ()
    """The functions the model may call, each as the JSON text of OpenAI's ``{"type": "function", "function": …}``;
    the chat template shows them to the model."""


@dataclass(frozen=True)
class Cancel:
    """Stop the request ``request_id`` (a generation or a load) as soon as possible."""

    request_id: str


@dataclass(frozen=True)
class ForgetConversation:
    """Release the KV cache kept for a conversation (it was deleted)."""

    conversation_id: str


@dataclass(frozen=True)
class Shutdown:
    """Stop the engine thread after the step in progress; every reply still running ends (``ReplyFailed``)."""


@dataclass(frozen=True)
class InspectModel:
    """Check ``path`` and estimate its memory use under ``options``, without loading it."""

    request_id: str
    path: str
    options: LoadOptions = LoadOptions()


@dataclass(frozen=True)
class ListRemoteModels:
    """Ask ``server`` which models it runs (answered by RemoteModelsListed or RemoteModelsFailed)."""

    request_id: str
    server: RemoteServer


Request = Union[LoadModel, Generate, Cancel, ForgetConversation, Shutdown, InspectModel, ListRemoteModels]


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class MemoryStats:
    """Memory figures at one moment, in bytes. ``device`` is "cuda" or "cpu"."""

    device: str = "cpu"
    weight_bytes: int = 0
    kv_bytes_conversation: int = 0
    kv_bytes_total: int = 0
    device_used_bytes: int = 0
    device_free_bytes: int = 0
    device_total_bytes: int = 0
    process_rss_bytes: int = 0


@dataclass(frozen=True)
class StatusChanged:
    """What the engine is doing now, with a human-readable detail."""

    state: EngineState
    detail: str = ""


@dataclass(frozen=True)
class FetchProgress:
    """Download progress of the default model."""

    done_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class LoadProgress:
    """Progress of loading a model; ``unit`` says what ``done``/``total`` count."""

    request_id: str
    done: int
    total: int
    unit: str = "tensors"


@dataclass(frozen=True)
class ModelLoaded:
    request_id: str
    name: str
    path: str
    device: str
    precision: str  # the formats in words (``FormatPlan.label``), e.g. "fp16 weights, int4 copy for decoding"
    context_length: int
    load_s: float
    memory: MemoryStats = MemoryStats()
    notices: tuple[str, ...] = ()  # things the user should know (e.g. "no chat template: using a plain one")
    server: str = ""  # the remote server's base URL when the model runs there; "" for a model in this process
    tool_format: str = "hermes"  # how the model writes tool calls (``engine.chat.tool_formats``)
    kv_cache: str = ""  # the KV cache's precision (``FormatPlan.kv_cache``: "bf16", "int8", …); "" for a remote model
    draft_model: str = ""  # the name of the model drafting for this one; "" for none (``LoadOptions.draft_model``)
    context_reason: str = ""  # why ``context_length``, e.g. "32 768 of 131 072 tokens: the default for chat, …"


@dataclass(frozen=True)
class LoadFailed:
    """A model could not be loaded; ``message`` says what, where, and what to do."""

    request_id: str
    message: str


@dataclass(frozen=True)
class PromptProgress:
    """A long prompt is being read into the KV cache: ``computed_tokens`` of its ``prompt_tokens`` are in (sent at
    most every ``PROMPT_PROGRESS_INTERVAL_S`` while it is read, never for a prompt read in one step)."""

    request_id: str
    computed_tokens: int
    prompt_tokens: int


PROMPT_PROGRESS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class PrefillDone:
    """The prompt is in the KV cache; sent just before the first token."""

    request_id: str
    tokenize_ms: float
    prompt_tokens: int
    reused_tokens: int
    prefill_ms: float
    context_length: int
    dropped_turns: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenChoice:
    """A token as the model weighed it: its text, its UTF-8 bytes (a token may hold part of a character) and its
    log-probability (natural log, after a constraint's mask, before temperature and top-p)."""

    token: str
    token_bytes: tuple[int, ...]
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's ``TokenChoice`` and the likeliest ``top`` ones at its place, best first."""

    chosen: TokenChoice
    top: tuple[TokenChoice, ...] = ()


@dataclass(frozen=True)
class TokenStreamed:
    """New reply text. ``text`` may hold several tokens' worth, or none (a split character).

    ``logprobs``: when ``SamplingParams.logprobs`` asked for them, one entry per token whose text this event
    (first) shows.
    """

    request_id: str
    text: str
    tokens_generated: int
    decode_tok_s: float
    timestamp: float
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class RemoteFigures:
    """What a remote server reported about one reply; None where it reported nothing.

    From ``usage``: the token counts (``cached_tokens`` from ``prompt_tokens_details``). From llama.cpp's
    ``timings``: ``prompt_per_second``, ``predicted_per_second`` (``decode_tok_s``) and ``cache_n``.
    """

    server: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_tok_s: float | None = None
    decode_tok_s: float | None = None
    cache_n: int | None = None


@dataclass(frozen=True)
class RequestStats:
    """Everything measured for one reply (for a remote model: by this client, the network included)."""

    tokenize_ms: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    decode_tok_s: float = 0.0
    tokens_generated: int = 0
    finish_reason: FinishReason = "eos"
    context_length: int = 0
    dropped_turns: tuple[int, ...] = ()
    memory: MemoryStats = field(default_factory=MemoryStats)
    started_at: float = 0.0
    finished_at: float = 0.0
    remote: RemoteFigures | None = None  # what a remote server itself reported
    drafted_tokens: int = 0  # tokens speculative drafts proposed (``engine/chat/speculative``)
    accepted_tokens: int = 0  # of those, the ones the model said
    decode_steps: int = 0  # forward steps that said tokens: tokens_generated / decode_steps tokens a step

    @property
    def tokens_per_step(self) -> float:
        """Tokens said per decoding step: 1 without drafts, more as drafts are accepted (0 before any step)."""
        return self.tokens_generated / self.decode_steps if self.decode_steps else 0.0


@dataclass(frozen=True)
class ReplyFinished:
    """The reply is complete; ``text`` is all of it."""

    request_id: str
    text: str
    stats: RequestStats


@dataclass(frozen=True)
class ReplyFailed:
    """The reply broke off; ``partial_text`` is what was produced before."""

    request_id: str
    message: str
    partial_text: str = ""


ENGINE_FAILURE = "The engine failed while handling this request"  # how a ReplyFailed from a crash begins


def engine_failure_message(exc: Exception) -> str:
    """A ``ReplyFailed`` message for a reply the engine's own failure ended."""
    return f"{ENGINE_FAILURE}: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class MemorySampled:
    """A periodic memory reading (about once a second while the engine is busy or loaded)."""

    memory: MemoryStats
    timestamp: float


@dataclass(frozen=True)
class KVPoolStats:
    """The block-wise KV cache of the loaded model at one moment.

    ``blocks_used`` are held by at least one sequence; ``blocks_shared`` by more than
    one (a common prefix held once); ``blocks_cached`` hold no running sequence but keep
    a reusable prefix until evicted; the rest are free. Bytes are ``blocks × bytes_per_block``.
    """

    block_size: int = 0
    blocks_total: int = 0
    blocks_used: int = 0
    blocks_shared: int = 0
    blocks_cached: int = 0
    bytes_per_block: int = 0


@dataclass(frozen=True)
class BatchSampled:
    """The scheduler's state, sent after each step that changed it (at most ~10 times a second).

    ``running`` requests are in the batch, ``waiting`` ones queue for room in the pool;
    ``throughput_tok_s`` counts new tokens of all requests per second over the last few seconds.
    """

    running: int
    waiting: int
    throughput_tok_s: float
    pool: KVPoolStats
    timestamp: float


@dataclass(frozen=True)
class EngineError:
    """Something failed outside any single request."""

    message: str


@dataclass(frozen=True)
class PrecisionEstimate:
    """Memory to run the model at ``precision`` (``total_bytes``: with overhead, and with the draft model where one
    is chosen); ``verdict`` is "fits", "tight" or "won't fit"."""

    precision: str
    weight_bytes: int
    kv_bytes: int
    total_bytes: int
    verdict: str


@dataclass(frozen=True)
class ModelInspected:
    """What ``InspectModel`` found: the model, and its estimates on ``device`` for ``context_length`` tokens.

    ``auto_precision`` is what ``precision="auto"`` would pick, or None when nothing fits. ``context_length`` is
    the context a load would take (the one asked for, or what fits up to 32 768 tokens), ``context_reason`` that
    choice in words ("32 768 of 131 072 tokens: what fits in 20.00 GiB free"; "" when nothing fits).
    ``draft_weight_bytes`` and ``draft_kv_bytes``: what the draft model the options name holds beside it, its weights
    and its KV pool (0 without one), counted in each estimate's total. ``expert_format``: the format a mixture's
    experts keep whatever the precision ("MXFP4"), "" where they take the precision's.
    """

    request_id: str
    path: str
    name: str
    kind: str
    n_params: int
    native_context_length: int
    context_length: int
    device: str
    estimates: tuple[PrecisionEstimate, ...]
    available_bytes_cpu: int
    available_bytes_cuda: int
    cuda_available: bool
    auto_precision: str | None
    notes: tuple[str, ...] = ()
    file_type: str = ""  # a GGUF file's quantization as llama.cpp names it ("Q4_K_M"); "" when none is stated
    context_reason: str = ""
    draft_weight_bytes: int = 0
    draft_kv_bytes: int = 0
    expert_format: str = ""  # "MXFP4": the experts stay in the file's blocks whatever the precision (gpt-oss, CPU)


@dataclass(frozen=True)
class InspectFailed:
    """``InspectModel`` refused the path; ``message`` says what is wrong and what to do."""

    request_id: str
    message: str


@dataclass(frozen=True)
class RemoteModelsListed:
    """The models the server at ``base_url`` runs, by id, as its ``GET /v1/models`` listed them."""

    request_id: str
    base_url: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class RemoteModelsFailed:
    """``ListRemoteModels`` got no list; ``message`` says why and what to do."""

    request_id: str
    message: str


Event = Union[
    StatusChanged,
    FetchProgress,
    LoadProgress,
    ModelLoaded,
    LoadFailed,
    PromptProgress,
    PrefillDone,
    TokenStreamed,
    ReplyFinished,
    ReplyFailed,
    MemorySampled,
    BatchSampled,
    EngineError,
    ModelInspected,
    InspectFailed,
    RemoteModelsListed,
    RemoteModelsFailed,
]
