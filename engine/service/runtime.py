"""The model owner: handles each request on the engine thread and reports what happened.

Reading order of one reply: ``_generate`` renders the chat into prompt ids
(``prompt``), takes the conversation's KV cache (``cache_store``), runs the decode
loop (``generation``), and reports figures (``RequestStats``).
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace

import torch

from engine.chat.cache_store import CacheStore
from engine.chat.generation import CachedSequence, DecodeLoop, ReplyOutcome
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
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    Request,
    RequestStats,
    StatusChanged,
    TokenStreamed,
)
from engine.service.background_load import CANCELLED_MESSAGE, BackgroundLoad, LoadDone

SUPERSEDED_MESSAGE = "Another model was chosen before this one finished loading."


class ModelRuntime:
    """Holds at most one loaded model and the KV caches of recent conversations."""

    def __init__(self, emit: EventSink, watch: CancelWatch) -> None:
        self._emit = emit
        self._watch = watch
        self._loaded: LoadedModel | None = None
        self._caches: CacheStore | None = None
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
        elif isinstance(request, ForgetConversation) and self._caches:
            self._caches.forget(request.conversation_id)

    def idle(self) -> None:
        if self._loaded:
            self._emit(MemorySampled(self._memory(""), time.perf_counter()))

    def close(self) -> None:
        if self._pending:
            self._pending.cancel()
            self._pending.join(timeout=5)
        self._loaded = None
        self._caches = None

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
            self._emit(ModelLoaded(
                done.request_id, loaded.name, loaded.path, loaded.device, loaded.precision_label,
                loaded.context_length, loaded.load_s, self._memory(""), loaded.notices,
            ))
        self._emit_ready()

    def _swap_in(self, loaded: LoadedModel) -> None:
        """The new model replaces the old one only now that it is ready; the old one's memory is freed."""
        self._loaded = loaded
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
        loaded, caches = self._loaded, self._caches
        if loaded is None or caches is None:
            self._emit(ReplyFailed(request.request_id, "No model is loaded yet. Open a model first."))
            return
        started = time.perf_counter()
        try:
            plan = self._plan(loaded, request)
        except (ContextOverflow, ModelFileError) as exc:  # ModelFileError: the chat template failed
            self._emit(ReplyFailed(request.request_id, str(exc)))
            return
        tokenize_ms = (time.perf_counter() - started) * 1000
        self._emit(StatusChanged("generating", loaded.name))
        seq = caches.checkout(request.conversation_id)
        stream = _Stream(self._emit, request.request_id, plan, tokenize_ms, loaded.context_length)
        try:
            sampling = replace(request.sampling, stop=request.sampling.stop + loaded.template.stop_strings)
            loop = DecodeLoop(
                loaded.backend, loaded.tokenizer, sampling, loaded.eos_ids, loaded.context_length,
                is_cancelled=lambda: self._watch.is_cancelled(request.request_id),
                on_prefill=stream.prefilled,
                on_text=stream.token,
            )
            outcome = loop.run(seq, plan.token_ids)
        except Exception as exc:
            self._fail(request, exc, stream.text, seq)
            return
        finally:
            caches.release(request.conversation_id)
            self._watch.forget(request.request_id)
        self._finish(request, plan, outcome, tokenize_ms, started)
        self._emit_ready()

    def _plan(self, loaded: LoadedModel, request: Generate) -> PromptPlan:
        budget = reply_budget(request.sampling.max_new_tokens, loaded.context_length)
        if request.prompt is not None:
            return plan_raw_prompt(request.prompt, loaded.tokenize, loaded.context_length, budget)
        return plan_prompt(
            request.messages, loaded.render, loaded.tokenize, loaded.context_length, budget, request.overflow
        )

    def _fail(self, request: Generate, exc: Exception, partial: str, seq: CachedSequence) -> None:
        """A reply broke off (out of memory, say): free its working memory, keep what was said.

        The conversation's cache is dropped too: it may hold a half-written step. The next
        reply prefills from scratch.
        """
        seq.kv = self._loaded.backend.new_cache() if self._loaded else seq.kv
        seq.token_ids.clear()
        gc.collect()
        if _is_out_of_memory(exc):
            message = (
                "The model ran out of memory while replying. The partial reply is kept, and the next "
                "message will work; a shorter context or a smaller precision leaves more room."
            )
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        else:
            message = f"The reply failed: {type(exc).__name__}: {exc}"
        self._emit(ReplyFailed(request.request_id, message, partial))
        self._emit_ready()

    def _finish(self, request: Generate, plan: PromptPlan, outcome: ReplyOutcome, tokenize_ms: float, started: float) -> None:
        decode_steps = max(outcome.tokens_generated - 1, 0)
        stats = RequestStats(
            tokenize_ms=tokenize_ms,
            prompt_tokens=len(plan.token_ids),
            reused_tokens=outcome.reused_tokens,
            prefill_ms=outcome.prefill_ms,
            ttft_ms=(outcome.first_token_at - started) * 1000,
            decode_ms=outcome.decode_ms,
            decode_tok_s=decode_steps / (outcome.decode_ms / 1000) if outcome.decode_ms > 0 else 0.0,
            tokens_generated=outcome.tokens_generated,
            finish_reason=outcome.finish_reason,
            context_length=self._loaded.context_length if self._loaded else 0,
            dropped_turns=plan.dropped_turns,
            memory=self._memory(request.conversation_id),
            started_at=started,
            finished_at=time.perf_counter(),
        )
        self._emit(ReplyFinished(request.request_id, outcome.text, stats))

    def _memory(self, conversation_id: str):
        loaded, caches = self._loaded, self._caches
        if loaded is None or caches is None:
            return read_memory("cpu", 0, 0, 0)
        return read_memory(loaded.device, loaded.weight_bytes, caches.bytes_of(conversation_id), caches.total_bytes())


def _is_out_of_memory(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text or "can't allocate memory" in text


class _Stream:
    """Turns the decode loop's callbacks into events, on the engine thread."""

    def __init__(self, emit: EventSink, request_id: str, plan: PromptPlan, tokenize_ms: float, context_length: int) -> None:
        self._emit = emit
        self._request_id = request_id
        self._plan = plan
        self._tokenize_ms = tokenize_ms
        self._context_length = context_length
        self._first_at = 0.0
        self.text = ""

    def prefilled(self, reused: int, prefill_ms: float) -> None:
        self._first_at = time.perf_counter()
        self._emit(PrefillDone(
            self._request_id, self._tokenize_ms, len(self._plan.token_ids), reused, prefill_ms,
            self._context_length, self._plan.dropped_turns,
        ))

    def token(self, text: str, count: int) -> None:
        now = time.perf_counter()
        self.text += text
        elapsed = now - self._first_at
        rate = (count - 1) / elapsed if elapsed > 0 else 0.0
        self._emit(TokenStreamed(self._request_id, text, count, rate, now))
