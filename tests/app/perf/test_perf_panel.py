"""The panel shows exactly the figures a (scripted, fake) engine sent, and refreshes sparingly."""

from __future__ import annotations

import sys

from PySide6.QtGui import QImage
from PySide6.QtWidgets import QLabel, QMainWindow

from app.perf.dock import PerformanceDock
from app.perf.format import format_bytes, format_count, format_finish_reason, format_ms, format_tok_s, format_tokens
from app.perf.panel import MAX_REFRESH_HZ, PerformancePanel, value_label_name
from app.perf.preview import render_preview
from engine.protocol.messages import (
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    PrefillDone,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)

GIB = 1024**3


class ScriptedEngine:
    """Emits the events a real engine would, with figures chosen by the test."""

    def __init__(self) -> None:
        self.clock = 1000.0
        self.memory = MemoryStats("cuda", 3 * GIB, 0, 0, 5 * GIB, 11 * GIB, 16 * GIB, GIB)

    def load(self) -> list:
        return [ModelLoaded("load", "TinyChat-1B", "/models/tiny", "cuda", "bf16", 8192, 4.0, self.memory)]

    def sample(self) -> MemorySampled:
        self.clock += 1.0
        return MemorySampled(self.memory, self.clock)

    def prefill(self, request_id: str, prompt: int, reused: int) -> PrefillDone:
        return PrefillDone(request_id, 3.25, prompt, reused, 87.5, 8192, ())

    def tokens(self, request_id: str, count: int) -> list[TokenStreamed]:
        events = []
        for index in range(1, count + 1):
            self.clock += 0.02
            events.append(TokenStreamed(request_id, "w", index, 40.0 + index / 100, self.clock))
        return events

    def finish(self, request_id: str, prompt: int, reused: int, count: int) -> ReplyFinished:
        self.memory = MemoryStats("cuda", 3 * GIB, 40_000 * count, 90_000 * count, 5 * GIB + count, 11 * GIB, 16 * GIB, GIB + count)
        stats = RequestStats(3.25, prompt, reused, 87.5, 131.0, 20.0 * count, 49.75, count, "max_tokens", 8192, (0,), self.memory, self.clock - 1, self.clock)
        return ReplyFinished(request_id, "w" * count, stats)


def reply_events(engine: ScriptedEngine, request_id: str, prompt: int, reused: int, count: int) -> list:
    return [engine.prefill(request_id, prompt, reused), *engine.tokens(request_id, count), engine.finish(request_id, prompt, reused, count)]


def label_text(panel: PerformancePanel, key: str) -> str:
    return panel.findChild(QLabel, value_label_name(key)).text()


def feed(panel: PerformancePanel, events: list) -> None:
    for event in events:
        panel.on_event(event)


def test_labels_show_the_figures_the_engine_sent(panel, qtbot):
    engine = ScriptedEngine()
    first = reply_events(engine, "r1", 500, 0, 60)
    second = reply_events(engine, "r2", 700, 560, 80)
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        feed(panel, engine.load() + [engine.sample()] + first + second)
    stats = second[-1].stats
    assert label_text(panel, "ttft") == format_ms(stats.ttft_ms) == "131 ms"
    assert label_text(panel, "tokenize") == format_ms(stats.tokenize_ms)
    assert label_text(panel, "reused") == format_tokens(560)
    assert label_text(panel, "prefilled") == format_tokens(140)
    assert label_text(panel, "prefill_speed") == format_tok_s(140 / 0.0875)
    assert label_text(panel, "decode_speed") == format_tok_s(stats.decode_tok_s) == "49.8 tok/s"
    assert label_text(panel, "tokens_generated") == format_count(80)
    assert label_text(panel, "finish_reason") == format_finish_reason("max_tokens")
    assert label_text(panel, "session_replies") == "2"
    assert label_text(panel, "session_throughput") == format_tok_s(140 / (20.0 * 140 / 1000))
    assert label_text(panel, "kv_conversation") == format_bytes(stats.memory.kv_bytes_conversation)
    assert label_text(panel, "kv_total") == format_bytes(stats.memory.kv_bytes_total)
    assert label_text(panel, "weights") == "3.00 GiB"
    assert label_text(panel, "device_used") == format_bytes(5 * GIB + 80)
    assert label_text(panel, "device_free") == "11.0 GiB"
    assert label_text(panel, "device_total") == "16.0 GiB"
    assert panel.findChild(QLabel, "device_used_caption").text() == "GPU memory used"
    assert panel.context_bar.format() == "780 / 8,192 tokens (10 %)"
    assert "TinyChat-1B" in panel.model_label.text()


def test_while_streaming_the_live_figures_are_the_latest_token_event(panel, qtbot):
    engine = ScriptedEngine()
    streamed = engine.tokens("r1", 25)
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        feed(panel, [engine.prefill("r1", 300, 0), *streamed])
    assert label_text(panel, "decode_speed") == format_tok_s(50.0)  # a token each 0.02 s, as the events are stamped
    assert label_text(panel, "tokens_generated") == "25"
    assert label_text(panel, "finish_reason") == "streaming…"
    assert label_text(panel, "ttft") == "—", "a request the panel was not told of has no known start"


def test_a_burst_of_events_causes_one_refresh(panel, qtbot):
    engine = ScriptedEngine()
    refreshes = []
    panel.refreshed.connect(lambda: refreshes.append(1))
    feed(panel, [engine.prefill("r1", 300, 0), *engine.tokens("r1", 500)])
    qtbot.wait(350)
    assert len(refreshes) == 1
    assert label_text(panel, "tokens_generated") == "500"


def test_steady_streaming_refreshes_at_most_ten_times_a_second(panel, qtbot):
    engine = ScriptedEngine()
    refreshes = []
    panel.refreshed.connect(lambda: refreshes.append(1))
    panel.on_event(engine.prefill("r1", 300, 0))
    for token in engine.tokens("r1", 100):
        panel.on_event(token)
        qtbot.wait(5)
    assert 1 <= len(refreshes) <= MAX_REFRESH_HZ + 1


def test_a_hidden_panel_does_no_refresh_work_until_shown(panel, qtbot):
    engine = ScriptedEngine()
    refreshes = []
    panel.refreshed.connect(lambda: refreshes.append(1))
    panel.hide()
    feed(panel, [engine.prefill("r1", 300, 0), *engine.tokens("r1", 50)])
    qtbot.wait(300)
    assert refreshes == []
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.show()
    assert label_text(panel, "tokens_generated") == "50"


def test_closing_the_dock_from_the_view_menu_stops_refreshing(qtbot):
    window = QMainWindow()
    qtbot.addWidget(window)
    dock = PerformanceDock(window)
    window.addDockWidget(dock.allowedAreas().RightDockWidgetArea, dock)
    window.show()
    qtbot.waitExposed(window)
    action = dock.toggleViewAction()
    assert action.text() == "Performance" and action.isChecked()
    refreshes = []
    dock.panel.refreshed.connect(lambda: refreshes.append(1))
    action.trigger()
    assert not dock.panel.isVisible()
    dock.panel.on_event(ScriptedEngine().prefill("r1", 300, 0))
    qtbot.wait(300)
    assert refreshes == []


def test_panel_renders_offscreen_to_a_png(panel, qtbot, tmp_path):
    engine = ScriptedEngine()
    feed(panel, engine.load() + [engine.sample()] + reply_events(engine, "r1", 700, 560, 80))
    panel.refresh()
    path = tmp_path / "panel.png"
    assert panel.grab().save(str(path))
    image = QImage(str(path))
    assert (image.width(), image.height()) == (panel.width(), panel.height())
    assert len({image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}) > 20


def test_preview_script_renders_a_realistic_panel(qapp, tmp_path):
    path = tmp_path / "preview.png"
    render_preview(str(path), width=480)
    image = QImage(str(path))
    assert image.width() == 480 and image.height() > 600


def test_repainting_does_not_use_up_pythons_references_to_none(panel):
    """PySide6 6.12.0 on Python 3.11 drops a reference to None on every void call.

    The panel makes hundreds of such calls per refresh; None's count (a few
    thousand) then runs out within minutes of streaming and the app aborts with
    "deallocating None". PySide6 6.11.3 (or Python >= 3.12) does not have this.
    """
    engine = ScriptedEngine()
    feed(panel, engine.load() + reply_events(engine, "r1", 700, 560, 80))
    before = sys.getrefcount(None)
    for _ in range(20):
        panel.refresh()
        panel.repaint()
    lost = before - sys.getrefcount(None)
    assert lost < 50, f"{lost} references to None lost in 20 refreshes: pin pyside6-essentials==6.11.3"


def test_the_model_line_names_the_kv_cache_and_the_draft_model(panel, qtbot):
    loaded = ModelLoaded("load", "Big", "/models/big.gguf", "cpu", "int4 weights", 8192, 1.0, kv_cache="int8",
                         draft_model="SmolLM2-135M")
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(loaded)
    assert panel.model_label.text() == ("<b>Big</b> · cpu · int4 weights · 8,192 tokens context · int8 KV cache · "
                                        "drafting with SmolLM2-135M")
