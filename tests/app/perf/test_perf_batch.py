"""Several replies at once: the panel shows the batch and KV pool, and the reply of the conversation on screen."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.perf.format import format_tok_s
from app.perf.state import PerfState
from engine.protocol.messages import BatchSampled, KVPoolStats, PrefillDone, PromptProgress, ReplyFinished, RequestStats, TokenStreamed

MIB = 1024**2
POOL = KVPoolStats(block_size=16, blocks_total=1000, blocks_used=120, blocks_shared=8, blocks_cached=40, bytes_per_block=MIB // 4)


def _interleaved(state_or_panel, count: int) -> None:
    """Replies "a" (conversation A) and "b" (conversation B) streaming in turn."""
    apply = getattr(state_or_panel, "apply", None) or state_or_panel.on_event
    apply(PrefillDone("a", 1.0, 300, 0, 10.0, 4096))
    apply(PrefillDone("b", 1.0, 50, 0, 10.0, 4096))
    for index in range(1, count + 1):
        apply(TokenStreamed("a", "x", index, 20.0, 100.0 + index / 10))
        apply(TokenStreamed("b", "y", 2 * index, 30.0, 100.05 + index / 10))


def test_each_conversation_has_its_own_reply_figures_while_both_stream():
    state = PerfState()
    state.track("a", "A")
    state.track("b", "B")
    state.show_conversation("A")
    assert state.reply.request_id == "a" and state.reply.waiting
    _interleaved(state, 5)

    assert (state.reply.request_id, state.reply.tokens_generated, state.reply.prompt_tokens) == ("a", 5, 300)
    assert {round(point.value, 6) for point in state.decode_speed.points()} == {10.0}  # A's: a token each 0.1 s
    state.show_conversation("B")
    assert (state.reply.request_id, state.reply.tokens_generated, state.context_length) == ("b", 10, 4096)
    state.apply(ReplyFinished("b", "y" * 10, RequestStats(tokens_generated=10, decode_ms=500.0, finish_reason="eos")))
    assert state.reply.finish_reason == "eos"
    state.apply(TokenStreamed("a", "x", 6, 20.0, 101.0))
    assert state.reply.tokens_generated == 10  # B's finished reply stays shown while A goes on
    state.show_conversation("new")
    assert state.reply is None


def test_batch_samples_are_kept_and_charted():
    state = PerfState()
    state.apply(BatchSampled(3, 1, 250.0, POOL, 100.0))
    state.apply(BatchSampled(2, 0, 180.0, POOL, 101.0))
    assert (state.batch.running, state.batch.waiting, state.now) == (2, 0, 101.0)
    assert [point.value for point in state.batch_throughput.points()] == [250.0, 180.0]


def test_the_panel_shows_running_waiting_throughput_and_the_pool(panel, qtbot):
    assert not panel.batch_box.isVisible()  # an engine that does not batch sends no such figures
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(BatchSampled(3, 2, 1234.5, POOL, 100.0))

    assert panel.batch_box.isVisible()
    assert panel.value_text("batch_running") == "3"
    assert panel.value_text("batch_waiting") == "2"
    assert panel.value_text("batch_throughput") == format_tok_s(1234.5) == "1,234 tok/s"
    assert panel.value_text("pool_size") == "1,000 blocks of 16 tokens · 250 MiB"
    assert panel.value_text("pool_used") == "120 · 30.0 MiB"
    assert panel.value_text("pool_shared") == "8 · 2.00 MiB"
    assert panel.value_text("pool_cached") == "40 · 10.0 MiB"
    assert panel.value_text("pool_free") == "840 · 210 MiB"


def test_the_panel_follows_the_conversation_on_screen(panel, qtbot):
    panel.track_reply("a", "A")
    panel.track_reply("b", "B")
    panel.show_conversation("B")
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        _interleaved(panel, 4)
    assert (panel.value_text("tokens_generated"), panel.value_text("prefilled")) == ("8", "50 tokens")

    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.show_conversation("A")
    assert (panel.value_text("tokens_generated"), panel.value_text("prefilled")) == ("4", "300 tokens")
    assert panel.value_text("decode_speed") == format_tok_s(10.0)  # A's: a token each 0.1 s


def test_a_reply_waiting_for_its_turn_says_so(panel, qtbot):
    panel.track_reply("a", "A")
    panel.show_conversation("A")
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        pass
    assert panel.value_text("finish_reason") == "waiting for its turn…"
    assert panel.value_text("prefilled") == "—"
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(PrefillDone("a", 1.0, 300, 0, 10.0, 4096))
    assert panel.value_text("finish_reason") == "streaming…"


def test_a_reply_reading_a_long_prompt_says_how_far_it_got(panel, qtbot):
    panel.track_reply("a", "A")
    panel.show_conversation("A")
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(PromptProgress("a", 3_000, 12_000))
    assert panel.value_text("finish_reason") == "reading the conversation… 25 % of 12,000 tokens"
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(PrefillDone("a", 1.0, 12_000, 0, 10.0, 32768))
    assert panel.value_text("finish_reason") == "streaming…"


def test_a_reply_stopped_while_it_waited_no_longer_says_it_waits(panel, qtbot):
    panel.track_reply("a", "A")
    panel.show_conversation("A")
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        panel.on_event(ReplyFinished("a", "", RequestStats(finish_reason="cancelled")))
    assert panel.value_text("finish_reason") == "cancelled"


def test_the_window_panel_shows_the_fake_batch_and_the_reply_on_screen(chat, script):
    script.replies_by_prompt = {"Name a bird": tuple(f" bird{i}" for i in range(80)), "Name a tree": (" oak",) * 80}
    script.token_delay_s = 0.01
    script.interleave = True
    window = chat.window
    window.performance_dock.show()
    panel = window.performance_dock.panel
    chat.wait_until_ready()
    chat.type_and_press_enter("Name a bird")
    chat.qtbot.waitUntil(lambda: "bird2" in chat.last_reply().content, timeout=5000)
    chat.qtbot.waitUntil(lambda: panel.value_text("batch_running") == "1", timeout=5000)
    chat.qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    chat.qtbot.waitUntil(lambda: panel.value_text("finish_reason") == "—", timeout=1000)  # the new one has no reply
    chat.type_and_press_enter("Name a tree")

    chat.qtbot.waitUntil(lambda: panel.value_text("batch_running") == "2", timeout=5000)
    assert panel.value_text("pool_used") == "8 · 2.00 MiB" and panel.value_text("pool_shared") == "2 · 512 KiB"
    panel.refresh()
    both, this_one = panel.state.throughput_tok_s, panel.state.reply_decode_tok_s
    assert panel.value_text("batch_throughput") == format_tok_s(both)
    assert this_one is not None and both > this_one, "two replies stream: all replies' rate is more than this one's"
    chat.qtbot.waitUntil(lambda: panel.value_text("finish_reason") == "streaming…", timeout=1000)
    chat.qtbot.waitUntil(lambda: not window.session.replies.answering, timeout=10_000)
    chat.qtbot.waitUntil(lambda: panel.value_text("batch_running") == "0", timeout=5000)
