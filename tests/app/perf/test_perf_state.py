"""PerfState keeps exactly the figures the engine sent, in O(1) per event."""

from app.perf.series import RollingSeries
from app.perf.state import PerfState
from engine.protocol.messages import (
    MemorySampled,
    MemoryStats,
    ModelLoaded,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    StatusChanged,
    TokenStreamed,
)

MEMORY = MemoryStats("cpu", 1000, 20, 50, 4000, 6000, 10000, 900)


def test_a_reply_is_built_from_prefill_tokens_and_final_stats():
    state = PerfState()
    assert state.apply(PrefillDone("r1", 2.5, 300, 200, 40.0, 4096, (0, 1)))
    for index in range(1, 4):
        state.apply(TokenStreamed("r1", "x", index, 10.0 + index, 100.0 + index / 10))
    reply = state.reply
    assert (reply.prompt_tokens, reply.reused_tokens, reply.new_tokens) == (300, 200, 100)
    assert reply.prefill_tok_s == 100 / 0.040
    assert (reply.tokens_generated, reply.decode_tok_s, reply.finish_reason) == (3, 13.0, None)
    assert reply.token_times == [100.1, 100.2, 100.3]
    stats = RequestStats(2.5, 300, 200, 40.0, 55.0, 210.0, 9.5, 3, "max_tokens", 4096, (0, 1), MEMORY, 99.9, 100.3)
    state.apply(ReplyFinished("r1", "xxx", stats))
    assert (reply.ttft_ms, reply.decode_ms, reply.decode_tok_s, reply.finish_reason) == (55.0, 210.0, 9.5, "max_tokens")
    assert state.memory == MEMORY
    assert state.context_length == 4096 and reply.context_in_use == 303


def test_session_throughput_aggregates_the_engines_per_reply_figures():
    state = PerfState()
    for request_id, tokens, decode_ms in (("a", 100, 2000.0), ("b", 50, 3000.0)):
        state.apply(PrefillDone(request_id, 1.0, 10, 0, 5.0, 2048))
        state.apply(ReplyFinished(request_id, "", RequestStats(tokens_generated=tokens, decode_ms=decode_ms)))
    assert state.session.replies == 2
    assert state.session.throughput_tok_s == 150 / 5.0


def test_loading_a_model_starts_a_new_session():
    state = PerfState()
    state.apply(ReplyFinished("a", "", RequestStats(tokens_generated=10, decode_ms=100.0)))
    state.apply(ModelLoaded("l", "tiny", "/m", "cpu", "fp32", 2048, 1.0, MEMORY))
    assert state.session.replies == 0 and state.reply is None
    assert (state.model.name, state.model.context_length, state.memory) == ("tiny", 2048, MEMORY)


def test_tokens_of_another_request_and_unrelated_events_are_ignored():
    state = PerfState()
    state.apply(PrefillDone("r1", 1.0, 10, 0, 5.0, 2048))
    state.apply(TokenStreamed("old", "x", 99, 1.0, 5.0))
    assert state.reply.tokens_generated == 0
    assert not state.apply(StatusChanged("idle"))


def test_a_failed_reply_says_why():
    state = PerfState()
    state.apply(PrefillDone("r1", 1.0, 10, 0, 5.0, 2048))
    state.apply(ReplyFailed("r1", "out of memory"))
    assert (state.reply.finish_reason, state.reply.failure) == ("error", "out of memory")


def test_memory_samples_feed_the_charts_and_the_clock():
    state = PerfState()
    state.apply(MemorySampled(MEMORY, 50.0))
    assert state.now == 50.0
    assert [p.value for p in state.device_used.points()] == [4000]
    assert [p.value for p in state.process_rss.points()] == [900]


def test_rolling_series_keeps_the_window_and_merges_close_points():
    series = RollingSeries(window_s=10.0, resolution_s=0.5)
    for step in range(40):
        series.add(step * 0.25, float(step))
    points = series.points()
    assert points[0].time >= 9.75 - 10.0 and points[-1].value == 39.0
    assert all(b.time - a.time >= 0.5 for a, b in zip(points, points[1:]))
    series.break_line()
    series.add(20.0, 1.0)
    assert series.latest().starts_run and series.points()[0].time >= 10.0
