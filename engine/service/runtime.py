"""The model owner: handles each request on the engine thread and reports what happened.

Reading order of one reply: ``_generate`` renders the chat into prompt ids
(``prompt``) and opens its event stream (``reply_events``). On the CPU fast path
the reply joins the batch (``batch_runner``, over ``engine/scheduler``), which runs
until no request is left, taking in new Generates between two steps. Other
backends run one reply at a time over the conversation's KV cache
(``cache_store``) with the decode loop (``generation``).
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace

import torch

from engine.chat.cache_store import CacheStore
from engine.chat.generation import CachedSequence, DecodeLoop
from engine.chat.prompt import ContextOverflow, PromptPlan, plan_prompt, plan_raw_prompt, reply_budget
from engine.host.allocator import keep_freed_buffers
from engine.host.cpu_threads import apply_engine_threads
from engine.host.memory import read_memory
from engine.models.inspection import inspect_request
from engine.models.loading import LoadedModel
from engine.models.model_source import ModelFileError
from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import (
    Cancel,
    ForgetConversation,
    Generate,
    InspectModel,
    LoadFailed,
    LoadModel,
    MemorySampled,
    ModelLoaded,
    ReplyFailed,
    Request,
    SamplingParams,
    StatusChanged,
)
from engine.service.background_load import CANCELLED_MESSAGE, BackgroundLoad, LoadDone
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents, is_out_of_memory

SUPERSEDED_MESSAGE = "Another model was chosen before this one finished loading."
ONE_AT_A_TIME_NOTICE = "This model's path answers one request at a time: further requests wait for the reply before them."


class ModelRuntime:
    """Holds at most one loaded model and the KV caches of recent conversations."""

    def __init__(self, emit: EventSink, watch: CancelWatch) -> None:
        self._emit = emit
        self._watch = watch
        self._loaded: LoadedModel | None = None
        self._caches: CacheStore | None = None  # per-conversation caches, for backends without batching
        self._batch: BatchRunner | None = None
        self._pending: BackgroundLoad | None = None
        apply_engine_threads()
        keep_freed_buffers()

    def handle(self, request: Request | LoadDone) -> None:
        if isinstance(request, LoadModel):
            self._start_load(request)
        elif isinstance(request, LoadDone):
            self._finish_load(request)
        elif isinstance(request, Cancel):
            self._cancel_load_if(request.request_id)
        elif isinstance(request, Generate):
            self._generate(request)
            if self._pending:  # a Cancel for the load may have arrived during the reply
                self._cancel_load_if(self._pending.request.request_id)
        elif isinstance(request, InspectModel):
            self._emit(inspect_request(request))
        elif isinstance(request, ForgetConversation):
            self._forget(request.conversation_id)

    def idle(self) -> None:
        if self._loaded:
            self._emit(MemorySampled(self._memory(""), time.perf_counter()))

    def close(self) -> None:
        if self._pending:
            self._pending.cancel()
            self._pending.join(timeout=5)
        self._loaded = None
        self._caches = self._batch = None

    def _forget(self, conversation_id: str) -> None:
        """A deleted conversation's KV cache goes (batching: its blocks no other conversation shares)."""
        if self._batch is not None:
            self._batch.forget_conversation(conversation_id)
        elif self._caches is not None:
            self._caches.forget(conversation_id)

    # ------------------------------------------------------------ loading

    def _start_load(self, request: LoadModel) -> None:
        """The newest load wins: one still in flight is cancelled."""
        if self._pending:
            self._pending.cancel()
            self._emit(LoadFailed(self._pending.request.request_id, SUPERSEDED_MESSAGE))
        self._pending = BackgroundLoad(request, self._emit, self._watch.post)
        self._pending.start()

    def _cancel_load_if(self, request_id: str) -> None:
        if self._pending and self._pending.request.request_id == request_id and self._watch.is_cancelled(request_id):
            self._pending.cancel()

    def _finish_load(self, done: LoadDone) -> None:
        load = self._pending
        if load is None or load.request.request_id != done.request_id:
            return  # a superseded load: its LoadFailed went out when the newer load started
        self._pending = None
        self._watch.forget(done.request_id)
        if load.result is None:
            self._emit(LoadFailed(done.request_id, load.error or CANCELLED_MESSAGE))
        else:
            self._swap_in(load.result)
            loaded = load.result
            notices = loaded.notices + (() if self._batch else (ONE_AT_A_TIME_NOTICE,))
            self._emit(ModelLoaded(
                done.request_id, loaded.name, loaded.path, loaded.device, loaded.precision_label,
                loaded.context_length, loaded.load_s, self._memory(""), notices,
            ))
        self._emit_ready()

    def _swap_in(self, loaded: LoadedModel) -> None:
        """The new model replaces the old one only now that it is ready; the old one's memory is freed."""
        self._loaded = loaded
        self._batch = self._caches = None  # the old model's KV memory goes before the new model's is taken
        if hasattr(loaded.backend, "forward_batch"):
            self._batch = BatchRunner(loaded, self._emit, self._watch.is_cancelled)
        else:
            self._caches = CacheStore(loaded.backend.new_cache, loaded.backend.cache_bytes)
        gc.unfreeze()  # the previous model's objects may go now
        gc.collect()
        gc.freeze()  # torch, transformers and the model live long: keep full collections (GIL held) short
        if loaded.device == "cuda":
            torch.cuda.empty_cache()

    def _emit_ready(self) -> None:
        loaded = self._loaded
        if loaded:
            self._emit(StatusChanged("ready", f"{loaded.name} on {loaded.device} ({loaded.precision_label})"))
        else:
            self._emit(StatusChanged("idle", "No model loaded"))

    # ------------------------------------------------------------ replies

    def _generate(self, request: Generate) -> None:
        loaded = self._loaded
        if loaded is None:
            self._emit(ReplyFailed(request.request_id, "No model is loaded yet. Open a model first."))
            return
        prepared = self._prepare(loaded, request)
        if prepared is None:
            return
        events, sampling = prepared
        if self._batch is not None:
            self._serve_batch(request, events, sampling)
        else:
            self._run_alone(loaded, request, events, sampling)
        self._emit_ready()

    def _prepare(self, loaded: LoadedModel, request: Generate) -> tuple[ReplyEvents, SamplingParams] | None:
        """The request's prompt planned and its event stream opened; ``None`` (and a ``ReplyFailed``) if it cannot be."""
        started = time.perf_counter()
        try:
            plan = self._plan(loaded, request)
        except (ContextOverflow, ModelFileError) as exc:  # ModelFileError: the chat template failed
            self._emit(ReplyFailed(request.request_id, str(exc)))
            return None
        tokenize_ms = (time.perf_counter() - started) * 1000
        self._emit(StatusChanged("generating", loaded.name))
        events = ReplyEvents(self._emit, request.request_id, plan, tokenize_ms, loaded.context_length, started)
        return events, replace(request.sampling, stop=request.sampling.stop + loaded.template.stop_strings)

    def _run_alone(self, loaded: LoadedModel, request: Generate, events: ReplyEvents, sampling: SamplingParams) -> None:
        """One reply to its end over its conversation's cache (backends without batching)."""
        caches = self._caches
        seq = caches.checkout(request.conversation_id)
        try:
            loop = DecodeLoop(
                loaded.backend, loaded.tokenizer, sampling, loaded.eos_ids, loaded.context_length,
                is_cancelled=lambda: self._watch.is_cancelled(request.request_id),
                on_prefill=events.prefilled,
                on_text=events.token,
            )
            outcome = loop.run(seq, events.prompt_ids)
        except Exception as exc:
            self._fail(events, exc, seq)
            return
        finally:
            caches.release(request.conversation_id)
            self._watch.forget(request.request_id)
        events.finished(outcome, self._memory(request.conversation_id))

    def _serve_batch(self, request: Generate, events: ReplyEvents, sampling: SamplingParams) -> None:
        """Steps the batch until it is empty; Generates that arrive meanwhile join between two steps."""
        batch = self._batch
        batch.add(request.request_id, request.conversation_id, events.prompt_ids, sampling, events)
        served = [request.request_id]
        while batch.has_work:
            batch.step(lambda held: self._memory("", held))
            for joining in self._watch.take(Generate):
                prepared = self._prepare(self._loaded, joining)
                if prepared is not None:
                    batch.add(joining.request_id, joining.conversation_id, prepared[0].prompt_ids, prepared[1], prepared[0])
                    served.append(joining.request_id)
        for request_id in served:
            self._watch.forget(request_id)

    def _plan(self, loaded: LoadedModel, request: Generate) -> PromptPlan:
        budget = reply_budget(request.sampling.max_new_tokens, loaded.context_length)
        if request.prompt is not None:
            return plan_raw_prompt(request.prompt, loaded.tokenize, loaded.context_length, budget)
        return plan_prompt(
            request.messages, loaded.render, loaded.tokenize, loaded.context_length, budget, request.overflow
        )

    def _fail(self, events: ReplyEvents, exc: Exception, seq: CachedSequence) -> None:
        """A reply broke off (out of memory, say): free its working memory, keep what was said.

        The conversation's cache is dropped too: it may hold a half-written step. The next
        reply prefills from scratch.
        """
        seq.kv = self._loaded.backend.new_cache() if self._loaded else seq.kv
        seq.token_ids.clear()
        gc.collect()
        if is_out_of_memory(exc) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        events.failed(exc)
        self._emit_ready()

    def _memory(self, conversation_id: str, request_bytes: int = 0):
        """Memory figures; the KV bytes of a conversation's cache, or (batching) of one request's blocks."""
        loaded, caches = self._loaded, self._caches
        if loaded is not None and self._batch is not None:
            return read_memory(loaded.device, loaded.weight_bytes, request_bytes, self._batch.total_bytes())
        if loaded is None or caches is None:
            return read_memory("cpu", 0, 0, 0)
        return read_memory(loaded.device, loaded.weight_bytes, caches.bytes_of(conversation_id), caches.total_bytes())
