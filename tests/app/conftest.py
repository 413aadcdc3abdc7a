"""Fixtures for the GUI tests: a fake runtime on a real engine thread, a qasync loop, a window.

The fake runtime runs on the engine thread exactly where the model would, so the
tests exercise the real queue, cancellation and hand-over to the GUI thread. By
default it answers one request at a time, as the engine does without batching; with
``FakeScript.interleave`` it steps every reply it was asked for in turn, one token
each, taking new requests between steps, and reports a ``BatchSampled`` after each
round, as a batching engine does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import qasync
from PySide6.QtCore import Qt

from app.controller import EngineController
from app.conversations.sidebar import Sidebar
from app.window.main_window import MainWindow
from engine.protocol.channels import CancelWatch, EventSink
from engine.protocol.messages import (
    BatchSampled,
    Generate,
    InspectFailed,
    InspectModel,
    LoadFailed,
    LoadModel,
    LoadProgress,
    ModelInspected,
    KVPoolStats,
    ModelLoaded,
    PrecisionEstimate,
    PrefillDone,
    PromptProgress,
    ReplyFailed,
    ReplyFinished,
    Request,
    RequestStats,
    Shutdown,
    StatusChanged,
    TokenStreamed,
)
from engine.service.client import AsyncEngine
from engine.service.worker import ServesWhole

GIB = 1024**3
FAKE_WEIGHTS_FP32 = 2 * GIB
FAKE_KV_PER_TOKEN_FP32 = 64 * 1024
FAKE_SCALES = {"fp32": (1.0, 1.0), "bf16": (0.5, 0.5), "fp16": (0.5, 0.5), "int4": (0.16, 0.5)}  # (weights, KV cache)
FAKE_DRAFT_BYTES = (256 * 1024**2, 128 * 1024**2)  # a draft model's weights and KV pool
LOAD_STEPS = 10
FAKE_POOL_BLOCKS = 64
FAKE_BLOCK_BYTES = 256 * 1024
FAKE_TOK_S = 123.4
REPLY_ENDED = object()

@dataclass
class FakeScript:
    """How the fake model behaves; ``reply_tokens`` are streamed one per step."""

    reply_tokens: tuple[str, ...] = ("Hello", " from", " the", " **fake**", " model.")
    replies_by_prompt: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Tokens of the reply to a conversation whose last message is the key (else ``reply_tokens``)."""
    interleave: bool = False
    """Step all replies asked for in turn, as a batching engine does (else one after another)."""
    token_delay_s: float = 0.005
    load_delay_s: float = 0.0
    broken_path: str = "broken-model"
    reply_failure: str = ""
    """When set, a reply breaks off with a ReplyFailed of this message after two tokens, or at the next one."""
    crash: str = ""
    """When set, Generate raises RuntimeError(crash) after two tokens, or at the next one (the engine reports it)."""
    dropped_turns: tuple[int, ...] = ()
    """Reported in PrefillDone, as if the context had overflowed."""
    reading: tuple[tuple[int, int], ...] = ()
    """(tokens read, prompt tokens) sent as PromptProgress before PrefillDone, ``reading_delay_s`` apart."""
    reading_delay_s: float = 0.0
    free_cpu_bytes: int = 16 * GIB
    """What the fake reports as free system memory when asked to inspect a model."""
    context_reason: str | None = None
    """When set, the reason every inspection gives for its context (else the fake's own)."""
    expert_format: str = ""
    """What inspections say the model's experts stay in whatever the precision ("MXFP4"; "": none kept so)."""
    generates: list[Generate] = field(default_factory=list)
    loads: list[LoadModel] = field(default_factory=list)
    inspections: list[InspectModel] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    emitted: list = field(default_factory=list)
    """Every event the fake sent, in order (appended on the engine thread)."""

    @property
    def full_reply(self) -> str:
        return "".join(self.reply_tokens)

    def tokens_for(self, request: Generate) -> tuple[str, ...]:
        return self.replies_by_prompt.get(request.messages[-1].content, self.reply_tokens)


class FakeRuntime(ServesWhole):
    """Answers LoadModel, InspectModel and Generate like the real runtime, without a model."""

    def __init__(self, emit: EventSink, watch: CancelWatch, script: FakeScript) -> None:
        self._emit = lambda event: (script.emitted.append(event), emit(event))
        self._watch = watch
        self._script = script
        self._loaded_name = ""

    def handle(self, request: Request) -> None:
        if isinstance(request, LoadModel):
            self._script.loads.append(request)
            self._load(request)
        elif isinstance(request, InspectModel):
            self._script.inspections.append(request)
            self._emit(self._inspect(request))
        elif isinstance(request, Generate):
            self._script.generates.append(request)
            self._emit(StatusChanged("generating"))
            if self._script.interleave:
                self._generate_interleaved(request)
            else:
                for _step in self._reply_steps(request):
                    pass
            self._emit(StatusChanged("ready"))

    def idle(self) -> None:
        """The fake holds no memory worth sampling."""

    def close(self) -> None:
        self._script.closed.set()

    def _load(self, request: LoadModel) -> None:
        """Loads in ``LOAD_STEPS`` steps over ``load_delay_s``; a failed or cancelled load keeps the old model."""
        self._emit(StatusChanged("loading", request.path))
        for step in range(LOAD_STEPS):
            if self._watch.is_cancelled(request.request_id):
                self._fail(request, "Loading was cancelled; the previous model stays.")
                return
            self._emit(LoadProgress(request.request_id, step, LOAD_STEPS, "steps"))
            time.sleep(self._script.load_delay_s / LOAD_STEPS)
        self._watch.forget(request.request_id)
        if request.path == self._script.broken_path:
            self._fail(request, f"No model found at {request.path}: pick a folder or .gguf file.")
            return
        name = "Fake model" if request.path == "fake-model" else f"Fake {request.path.rsplit('/', 1)[-1]}"
        self._loaded_name = name
        notices = ("no chat template: using a plain one",) if "plain" in request.path else ()
        self._emit(ModelLoaded(request.request_id, name, request.path, "cpu", "fp32", 2048, 0.25, notices=notices))
        self._emit(StatusChanged("ready"))

    def _fail(self, request: LoadModel, message: str) -> None:
        self._watch.forget(request.request_id)
        self._emit(LoadFailed(request.request_id, message))
        if self._loaded_name:
            self._emit(StatusChanged("ready"))

    def _inspect(self, request: InspectModel) -> ModelInspected | InspectFailed:
        """A 0.5 B-parameter model; the KV cache grows with the asked context length; a draft model, when one is
        asked, is counted beside it as the engine counts it (``FAKE_DRAFT_BYTES``)."""
        if request.path == self._script.broken_path:
            return InspectFailed(request.request_id, f"No model found at {request.path}: pick a folder or .gguf file.")
        context = request.options.context_length or 4096
        draft = FAKE_DRAFT_BYTES if request.options.draft_model else (0, 0)
        estimates = tuple(
            _fake_estimate(precision, scale, context, self._script.free_cpu_bytes, sum(draft))
            for precision, scale in FAKE_SCALES.items()
        )
        fitting = [item.precision for item in estimates if item.verdict == "fits" and item.precision in AUTO_ON_CPU]
        return ModelInspected(
            request.request_id, request.path, "Fake inspected", "gguf", 500_000_000, 4096, context, "cpu",
            estimates, self._script.free_cpu_bytes, 0, False, fitting[0] if fitting else None, file_type="Q4_K_M",
            context_reason=self._context_reason(request),
            draft_weight_bytes=draft[0], draft_kv_bytes=draft[1], expert_format=self._script.expert_format,
        )

    def _context_reason(self, request: InspectModel) -> str:
        if self._script.context_reason is not None:
            return self._script.context_reason
        return "" if request.options.context_length else "4 096 tokens: the model's full context"

    def _break_off(self, request: Generate, text: str) -> bool:
        if self._script.crash:
            raise RuntimeError(self._script.crash)
        if self._script.reply_failure:
            self._emit(ReplyFailed(request.request_id, self._script.reply_failure, text))
            return True
        return False

    def _reply_steps(self, request: Generate) -> Iterator[None]:
        """The reply to ``request``, one token per step."""
        for read, total in self._script.reading:
            self._emit(PromptProgress(request.request_id, read, total))
            time.sleep(self._script.reading_delay_s)
            yield
        self._emit(PrefillDone(request.request_id, 1.0, 10, 0, 5.0, 2048, self._script.dropped_turns))
        text = ""
        finish_reason = "eos"
        for count, token in enumerate(self._script.tokens_for(request), start=1):
            if self._watch.is_cancelled(request.request_id):
                finish_reason = "cancelled"
                break
            time.sleep(self._script.token_delay_s)
            text += token
            self._emit(TokenStreamed(request.request_id, token, count, 123.4, time.perf_counter()))  # the engine's clock
            if count >= 2 and self._break_off(request, text):
                return
            yield
        self._watch.forget(request.request_id)
        stats = RequestStats(ttft_ms=42.0, decode_tok_s=123.4, tokens_generated=len(text.split()), finish_reason=finish_reason)
        self._emit(ReplyFinished(request.request_id, text, stats))

    def _generate_interleaved(self, first: Generate) -> None:
        """Step every running reply once per round; Generates that arrive meanwhile join the batch.

        Other requests that arrive meanwhile are handled once the batch is empty (a Shutdown at once).
        """
        running = {first.request_id: self._reply_steps(first)}
        later: list[Request] = []
        while running:
            for request_id, steps in list(running.items()):
                if next(steps, REPLY_ENDED) is REPLY_ENDED:
                    del running[request_id]
            while (request := self._watch.next_request(timeout=0)) is not None:
                if isinstance(request, Generate):
                    self._script.generates.append(request)
                    running[request.request_id] = self._reply_steps(request)
                elif isinstance(request, Shutdown):
                    self._watch.post(request)
                    return
                else:
                    later.append(request)
            self._emit(fake_batch_sample(len(running)))
        for request in later:
            self.handle(request)


def fake_batch_sample(running: int) -> BatchSampled:
    """What the fake reports after a round: 4 blocks a reply, 2 of them shared when several run, 8 cached."""
    pool = KVPoolStats(16, FAKE_POOL_BLOCKS, 4 * running, 2 if running > 1 else 0, 8, FAKE_BLOCK_BYTES)
    return BatchSampled(running, 0, FAKE_TOK_S * running, pool, time.perf_counter())


@pytest.fixture(autouse=True)
def hearth_home(tmp_path, monkeypatch):
    """Each test gets its own data folder, so conversations and settings never leak between tests."""
    home = tmp_path / "hearth-home"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    return home


AUTO_ON_CPU = ("fp32", "bf16", "int4")  # what the engine's automatic choice tries (memory_estimate.PRECISION_ORDER)


def _fake_estimate(precision: str, scale: tuple[float, float], context: int, free: int,
                   draft: int = 0) -> PrecisionEstimate:
    """``scale``: of the fp32 weights and of the fp32 KV cache; ``draft``: the draft model's bytes, in the total and
    out of the room the verdict weighs against."""
    weights, kv = int(FAKE_WEIGHTS_FP32 * scale[0]), int(FAKE_KV_PER_TOKEN_FP32 * scale[1]) * context
    total, room = weights + kv, free - draft
    verdict = "fits" if total <= 0.85 * room else "tight" if total <= room else "won't fit"
    return PrecisionEstimate(precision, weights, kv, total + draft, verdict)


@pytest.fixture
def script() -> FakeScript:
    return FakeScript()


@pytest.fixture
def fake_engine_factory(script: FakeScript):
    """Builds an AsyncEngine whose runtime is the fake one (call it with the loop running)."""
    return lambda: AsyncEngine(lambda emit, watch: FakeRuntime(emit, watch, script))


@pytest.fixture
def qasync_loop(qapp):
    """A qasync loop that counts as running while pytest-qt spins Qt's event loop."""
    loop = qasync.QEventLoop(qapp, already_running=True)
    yield loop
    loop._QEventLoop__is_running = False  # stop() would call QApplication.exit(), breaking later tests
    loop.close()
    asyncio.events._set_running_loop(None)


@pytest.fixture
def window(qtbot, qasync_loop, fake_engine_factory):
    """The main window with a started fake engine; the model "fake-model" is loading."""
    controller = EngineController()
    main_window = MainWindow(controller)
    qtbot.addWidget(main_window)
    main_window.show()
    controller.start(fake_engine_factory())
    main_window.session.load_model("fake-model")
    yield main_window
    controller.close()
    qtbot.wait(10)


@pytest.fixture
def reopen(qtbot):
    """Builds another window on the same data folder, as if Hearth were started again (no engine)."""

    def open_window() -> MainWindow:
        reopened = MainWindow(EngineController())
        qtbot.addWidget(reopened)
        reopened.show()
        return reopened

    return open_window


class ChatDriver:
    """Does what a user does in the window, and waits for what they would wait for."""

    def __init__(self, window: MainWindow, qtbot) -> None:
        self.window = window
        self.qtbot = qtbot
        self.prompt = window.input_bar.prompt

    def wait_until_ready(self) -> None:
        self.qtbot.waitUntil(self.window.input_bar.send_button.isEnabled, timeout=5000)

    def type_and_press_enter(self, text: str) -> None:
        self.qtbot.keyClicks(self.prompt, text)
        self.qtbot.keyClick(self.prompt, Qt.Key.Key_Return)

    def wait_until_reply_ends(self) -> None:
        self.qtbot.waitUntil(lambda: not self.window.session.generating, timeout=5000)

    def wait_until_cards_are_made(self) -> None:
        """An opened conversation gets its older cards a moment later (at once only on an idle machine)."""
        self.qtbot.waitUntil(lambda: not self.window.chat_view.loading, timeout=5000)

    def last_reply(self):
        return self.window.session.conversation.messages[-1]

    def shown_texts(self) -> list[str]:
        return [bubble.shown_text() for bubble in self.window.chat_view.bubbles]

    def send_and_wait(self, text: str) -> None:
        self.wait_until_ready()
        self.type_and_press_enter(text)
        self.wait_until_reply_ends()

    def sidebar_titles(self) -> list[str]:
        return self.window.findChild(Sidebar).titles()


@pytest.fixture
def chat(window, qtbot) -> ChatDriver:
    return ChatDriver(window, qtbot)


@pytest.fixture
def chat_view(qtbot):
    """A chat view on its own, 600 × 400, shown."""
    from app.chat.chat_view import ChatView

    view = ChatView()
    view.resize(600, 400)
    qtbot.addWidget(view)
    view.show()
    return view


class RealApp:
    """``app.main.run_window`` on ``qasync.run``, as ``app.main`` runs it, with a test scenario beside it.

    The scenario is a coroutine on the same Qt event loop as the window: it acts like
    a user (menu actions, keys) and awaits what a user would wait for (``until``).
    Unlike the ``window`` fixture (pytest-qt spinning Qt's loop), the asyncio loop
    here is qasync's own, with qasync's event-loop policy set for the whole process,
    so code that starts loops on other threads meets what it meets in the real app.
    """

    def __init__(self, engine_factory) -> None:
        self._engine_factory = engine_factory
        self.window: MainWindow | None = None

    def run(self, scenario, model_path: str = "fake-model", timeout_s: float = 60.0) -> None:
        """Open the app on ``model_path``, await ``scenario(window)``, close the window, wait for the app to end."""
        from PySide6.QtWidgets import QApplication

        from app.main import run_window

        before = set(QApplication.topLevelWidgets())
        QApplication.instance().setQuitOnLastWindowClosed(False)  # as app.main.create_application sets it

        async def with_app() -> None:
            app_task = asyncio.ensure_future(run_window(model_path, self._engine_factory))
            await self.until(lambda: app_task.done() or self._new_window(before) is not None)
            if app_task.done():
                app_task.result()  # raises what stopped the app from opening
            self.window = self._new_window(before)
            try:
                await asyncio.wait_for(scenario(self.window), timeout_s)
            finally:
                self.window.close()
                await asyncio.wait_for(app_task, 30)

        try:
            qasync.run(with_app())
        finally:
            QApplication.instance().setQuitOnLastWindowClosed(True)

    @staticmethod
    def _new_window(before: set) -> MainWindow | None:
        from PySide6.QtWidgets import QApplication

        fresh = [widget for widget in QApplication.topLevelWidgets() if widget not in before]
        return next((widget for widget in fresh if isinstance(widget, MainWindow) and widget.isVisible()), None)

    @staticmethod
    async def until(condition, timeout_s: float = 10.0, poll_s: float = 0.02) -> None:
        """Let the app run until ``condition()`` holds; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"still not true after {timeout_s} s: {condition}")
            await asyncio.sleep(poll_s)


@pytest.fixture
def real_app(qapp, fake_engine_factory) -> RealApp:
    """The app as ``app.main`` runs it, on the fake engine (``RealApp(AsyncEngine)`` for the real one)."""
    return RealApp(fake_engine_factory)
