"""The model owner: serves each request as it arrives and steps the running replies (engine thread).

Reading order of one reply: ``_generate`` renders the chat into prompt ids
(``prompt``), opens its event stream (``reply_events``) and hands it to the model's
runner; each ``step`` then runs one forward pass of the runner. The transformers
fallback (``HFBackend``) answers one request at a time (``sequence_runner``);
every other backend batches (``batch_runner``, over ``engine/scheduler``).

A new model loads beside the running one (``background_load``), which keeps
answering. When the load is done, the replies running on the old model finish on
it, so each says what it would have said; requests that arrive meanwhile wait and
start on the new model once the old one's last reply has ended. Then the old
model's memory is freed, the new runner takes its place and ``ModelLoaded`` goes
out. (The old replies are not cancelled: a user or an API client expects a reply
that has begun to end as it began. Nor do both models serve at once: the new KV
pool is sized on a GPU by the memory free when it is made.) A ``Generate`` that
arrives while no model is loaded but a load is in flight waits for that load too,
and fails with the load's message if the load fails.
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace
from functools import partial
from typing import Callable, Protocol

import torch

from engine.chat.grammar import ConstraintError
from engine.chat.prompt import ContextOverflow, PromptPlan, plan_prompt, plan_raw_prompt, reply_budget
from engine.forward.backend import HFBackend
from engine.host import garbage
from engine.host.allocator import set_up_process_memory
from engine.host.cpu_threads import apply_engine_threads
from engine.host.memory import read_memory
from engine.models.inspection import inspect_request
from engine.models.loading import LoadedModel
from engine.models.model_source import ModelFileError
from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import (
    Cancel,
    Constraint,
    Event,
    ForgetConversation,
    Generate,
    InspectModel,
    LoadFailed,
    LoadModel,
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    ReplyFailed,
    ReplyFinished,
    Request,
    SamplingParams,
    StatusChanged,
    engine_failure_message,
)
from engine.service.background_load import CANCELLED_MESSAGE, BackgroundLoad, LoadDone
from engine.service.batch_runner import BatchRunner, MemoryReading
from engine.service.reply_events import ReplyEvents
from engine.service.sequence_runner import SequenceRunner

SUPERSEDED_MESSAGE = "Another model was chosen before this one finished loading."
ONE_AT_A_TIME_NOTICE = "This model's path answers one request at a time: further requests wait for the reply before them."
NO_MODEL_MESSAGE = "No model is loaded yet. Open a model first."
CANCELLED_WAITING_MESSAGE = "The request was cancelled while it waited for the model to load."
SHUT_DOWN_MESSAGE = "The engine shut down before this reply finished."


class Runner(Protocol):
    """What the runtime drives its replies with: ``BatchRunner`` or ``SequenceRunner``."""

    @property
    def has_work(self) -> bool: ...

    def add(self, request_id: str, conversation_id: str, prompt_ids: list[int], sampling: SamplingParams,
            events: ReplyEvents, constraint: Constraint | None = None) -> None: ...

    def step(self, memory: MemoryReading) -> None: ...

    def forget_conversation(self, conversation_id: str) -> None: ...

    def total_bytes(self) -> int: ...

    def abandon_all(self, message: str) -> None: ...


def new_runner(loaded: LoadedModel, emit: EventSink, is_cancelled: Callable[[str], bool],
               budget_bytes: int | None = None) -> Runner:
    """The runner for ``loaded``'s backend: one request at a time for transformers, else the batch; its KV
    memory within ``budget_bytes`` (by default what the runner chooses for the device)."""
    if isinstance(loaded.backend, HFBackend):
        return SequenceRunner(loaded, is_cancelled, budget_bytes)
    return BatchRunner(loaded, emit, is_cancelled, budget_bytes=budget_bytes)


class ModelRuntime:
    """Holds at most one loaded model, its runner (the replies in flight and the KV caches), and a load."""

    def __init__(self, emit: EventSink, watch: CancelWatch) -> None:
        self._emit = emit
        self._watch = watch
        self._loaded: LoadedModel | None = None
        self._runner: Runner | None = None
        self._pending: BackgroundLoad | None = None  # a load in flight
        self._ready: BackgroundLoad | None = None  # a load done, waiting for the old model's replies to end
        self._waiting: list[Generate] = []  # requests for the model being loaded
        self._in_flight: set[str] = set()  # requests waiting or running, until their end event
        apply_engine_threads()
        set_up_process_memory()

    @property
    def has_work(self) -> bool:
        return self._runner is not None and self._runner.has_work

    def handle(self, request: Request | LoadDone) -> None:
        if isinstance(request, LoadModel):
            self._start_load(request)
        elif isinstance(request, LoadDone):
            self._finish_load(request)
        elif isinstance(request, Cancel):
            self._cancel(request.request_id)
        elif isinstance(request, Generate):
            self._generate(request)
        elif isinstance(request, InspectModel):
            self._emit(inspect_request(request))
        elif isinstance(request, ForgetConversation):
            if self._runner is not None:
                self._runner.forget_conversation(request.conversation_id)

    def step(self) -> None:
        """One step of the running replies; once none is left, a model waiting to swap in takes over."""
        runner = self._runner
        try:
            runner.step(self._memory)
        except Exception as exc:  # the runner's state is unknown: its replies end, a fresh runner takes over
            runner.abandon_all(engine_failure_message(exc))
            self._runner = new_runner(self._loaded, self._reply_event, self._watch.is_cancelled)
            raise
        if not runner.has_work:
            self._swap_if_ready()
            self._emit_ready()

    def idle(self) -> None:
        if self._loaded:
            self._emit(MemorySampled(self._memory(0), time.perf_counter()))

    def close(self) -> None:
        """Every request still waiting or running ends (``ReplyFailed``); a load in flight is cancelled."""
        if self._pending:
            self._pending.cancel()
            self._pending.join(timeout=5)
        self._fail_waiting(SHUT_DOWN_MESSAGE)
        if self._runner is not None:
            self._runner.abandon_all(SHUT_DOWN_MESSAGE)
        self._loaded = self._runner = self._pending = self._ready = None

    def _reply_event(self, event: Event) -> None:
        """Every reply event goes out here; a reply's end event ends its request (a late ``Cancel`` is moot)."""
        if isinstance(event, (ReplyFinished, ReplyFailed)):
            self._in_flight.discard(event.request_id)
            self._watch.forget(event.request_id)
        self._emit(event)

    def _cancel(self, request_id: str) -> None:
        """A load stops (one done but not yet in use is dropped); a request waiting for a model ends; a running
        reply ends at its next step."""
        if self._pending and self._pending.request.request_id == request_id:
            self._pending.cancel()
        if self._ready and self._ready.request.request_id == request_id:
            self._ready = None
            self._emit(LoadFailed(request_id, CANCELLED_MESSAGE))
            self._admit_waiting()
        waiting = [r for r in self._waiting if r.request_id == request_id]
        if waiting:
            self._waiting.remove(waiting[0])
            self._reply_event(ReplyFailed(request_id, CANCELLED_WAITING_MESSAGE))
        if request_id not in self._in_flight:
            self._watch.forget(request_id)

    # ------------------------------------------------------------ loading

    def _start_load(self, request: LoadModel) -> None:
        """The newest load wins: one still in flight, or done and waiting to swap in, is dropped (requests that
        waited for that one go to the model in use, or wait for this load if none is)."""
        for load in filter(None, (self._pending, self._ready)):
            load.cancel()
            self._emit(LoadFailed(load.request.request_id, SUPERSEDED_MESSAGE))
        self._ready = None
        self._pending = BackgroundLoad(request, self._emit, self._watch.post)
        self._pending.start()
        self._admit_waiting()

    def _finish_load(self, done: LoadDone) -> None:
        """A load ended: a failed one keeps the model in use (requests waiting for it fail with its message); a
        good one swaps in once the old model's replies are done."""
        load = self._pending
        if load is None or load.request.request_id != done.request_id:
            return  # a superseded load: its LoadFailed went out when the newer load started
        self._pending = None
        self._watch.forget(done.request_id)
        if load.result is None:
            self._emit(LoadFailed(done.request_id, load.error or CANCELLED_MESSAGE))
            self._fail_waiting(load.error or CANCELLED_MESSAGE)  # only ever waiting when no model is loaded
        else:
            self._ready = load
            if not self.has_work:
                self._swap_if_ready()
        self._emit_ready()

    def _swap_if_ready(self) -> None:
        """The loaded model takes over (the old one has no reply left); the requests that waited start on it."""
        load, self._ready = self._ready, None
        if load is None:
            return
        self._swap_in(load.result)
        loaded = load.result
        notices = loaded.notices + ((ONE_AT_A_TIME_NOTICE,) if isinstance(loaded.backend, HFBackend) else ())
        self._emit(ModelLoaded(
            load.request.request_id, loaded.name, loaded.path, loaded.device, loaded.precision_label,
            loaded.context_length, loaded.load_s, self._memory(0), notices, tool_format=loaded.template.tool_format,
            kv_cache=loaded.formats.kv_cache,
            draft_model=loaded.draft.name if loaded.draft else "", context_reason=loaded.context_reason,
        ))
        self._admit_waiting()

    def _swap_in(self, loaded: LoadedModel) -> None:
        """The old model and its KV memory go before the new model's runner takes its own."""
        self._loaded = self._runner = None
        gc.unfreeze()  # the previous model's objects may go now
        collected = garbage.collect()
        if loaded.device == "cuda":
            torch.cuda.empty_cache()
        self._loaded = loaded
        self._runner = new_runner(loaded, self._reply_event, self._watch.is_cancelled)
        if collected:  # else the old model's garbage would be frozen with the rest
            gc.freeze()  # torch, transformers and the model live long: keep full collections (GIL held) short

    def _emit_ready(self) -> None:
        """The state the engine is in now."""
        loaded = self._loaded
        if self.has_work:
            self._emit(StatusChanged("generating", loaded.name))
        elif loaded:
            self._emit(StatusChanged("ready", f"{loaded.name} on {loaded.device} ({loaded.precision_label})"))
        else:
            self._emit(StatusChanged("idle", "No model loaded"))

    # ------------------------------------------------------------ replies

    def _generate(self, request: Generate) -> None:
        """The reply joins the running ones; it waits if a model is about to take over."""
        self._in_flight.add(request.request_id)
        if self._ready is not None or (self._loaded is None and self._pending is not None):
            self._waiting.append(request)
        elif self._loaded is None:
            self._reply_event(ReplyFailed(request.request_id, NO_MODEL_MESSAGE))
        else:
            self._admit(request)

    def _admit(self, request: Generate) -> None:
        loaded = self._loaded
        started = time.perf_counter()
        try:
            plan = self._plan(loaded, request)
        except (ContextOverflow, ModelFileError) as exc:  # ModelFileError: the chat template failed
            self._reply_event(ReplyFailed(request.request_id, str(exc)))
            return
        tokenize_ms = (time.perf_counter() - started) * 1000
        self._emit(StatusChanged("generating", loaded.name))
        events = ReplyEvents(self._reply_event, request.request_id, plan, tokenize_ms, loaded.context_length, started)
        sampling = replace(request.sampling, stop=request.sampling.stop + loaded.template.stop_strings)
        try:
            self._runner.add(request.request_id, request.conversation_id, plan.token_ids, sampling, events,
                             request.constraint)
        except ConstraintError as exc:
            self._reply_event(ReplyFailed(request.request_id, str(exc)))
            self._emit_ready()

    def _admit_waiting(self) -> None:
        """The requests that waited for a model start on the one now loaded."""
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self._generate(request)

    def _fail_waiting(self, message: str) -> None:
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self._reply_event(ReplyFailed(request.request_id, message))

    def _plan(self, loaded: LoadedModel, request: Generate) -> PromptPlan:
        budget = reply_budget(request.sampling.max_new_tokens, loaded.context_length)
        if request.prompt is not None:
            return plan_raw_prompt(request.prompt, loaded.tokenize, loaded.context_length, budget)
        return plan_prompt(
            request.messages, partial(loaded.render, tools=request.tools), loaded.tokenize, loaded.context_length,
            budget, request.overflow,
        )

    def _memory(self, request_bytes: int) -> MemoryStats:
        """Memory figures, with the KV bytes one request holds (``request_bytes``) and all the runner holds."""
        loaded, runner = self._loaded, self._runner
        if loaded is None or runner is None:
            return read_memory("cpu", 0, 0, 0)
        return read_memory(loaded.device, loaded.held_weight_bytes, request_bytes, runner.total_bytes())
