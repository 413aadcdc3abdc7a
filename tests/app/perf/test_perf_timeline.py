"""The stage timeline is drawn to scale; the cached prompt, which took no time, is named in the legend only."""

import pytest

from app.perf.state import ReplyPerf
from app.perf.timeline import STAGE_COLORS, StageTimeline, build_layout, to_pixels


def finished_reply(reused: int) -> ReplyPerf:
    reply = ReplyPerf("r", tokenize_ms=10.0, prompt_tokens=400 + reused, reused_tokens=reused, prefill_ms=40.0)
    reply.token_times = [5.0 + i * 0.05 for i in range(11)]
    reply.tokens_generated, reply.ttft_ms, reply.decode_ms, reply.finish_reason = 11, 50.0, 500.0, "eos"
    return reply


def test_segment_widths_are_proportional_to_stage_durations():
    layout = build_layout(finished_reply(reused=0))
    placed = {segment.kind: width for segment, _, width in to_pixels(layout, 1100.0, layout.span)}
    assert layout.span == pytest.approx(550.0)
    assert placed["tokenize"] == pytest.approx(20.0)
    assert placed["prefill"] == pytest.approx(80.0)
    assert placed["decode"] == pytest.approx(1000.0)
    assert layout.segment("cached") is None


def test_tokens_are_ticked_at_their_engine_times_from_the_first_token():
    layout = build_layout(finished_reply(reused=0))
    assert layout.tick_ms(0) == pytest.approx(50.0)
    assert layout.tick_ms(-1) == pytest.approx(550.0)
    assert layout.tick_count == 11
    assert layout.tick_columns(550, layout.span) == [50 + 50 * i for i in range(10)] + [549]
    assert layout.tick_columns(55, layout.span) == [5 + 5 * i for i in range(10)] + [54]


def test_ticks_closer_than_a_pixel_share_one_column():
    reply = finished_reply(reused=0)
    reply.token_times = [5.0 + i * 0.0001 for i in range(1000)]
    layout = build_layout(reply)
    assert len(layout.tick_columns(100, layout.span)) < 100


def test_cached_tokens_take_no_width_on_the_bars_drawn_to_scale():
    layout = build_layout(finished_reply(reused=1_000_000))
    assert layout.segment("cached") is None
    assert (layout.segment("prefill").start, layout.first_token) == (10.0, 50.0)
    assert layout.span == pytest.approx(550.0)


def test_a_streaming_reply_grows_with_its_tokens():
    reply = finished_reply(reused=0)
    reply.ttft_ms = reply.decode_ms = reply.finish_reason = None
    layout = build_layout(reply)
    assert layout.segment("decode").start == 50.0
    assert layout.segment("decode").length == pytest.approx(500.0)


def test_cached_tokens_are_named_in_the_legend(qtbot):
    timeline = StageTimeline()
    qtbot.addWidget(timeline)
    timeline.resize(500, 140)
    timeline.show_reply(finished_reply(reused=1052))
    assert "cached:&nbsp;1,052&nbsp;tokens&nbsp;skipped" in timeline.legend.text()
    image = timeline.whole_bar.grab().toImage()
    decode_middle = image.pixelColor(image.width() * 3 // 4, timeline.whole_bar.CAPTION_HEIGHT + 10)
    assert decode_middle.name() == STAGE_COLORS["decode"].name()


def test_no_cached_caption_without_reuse(qtbot):
    timeline = StageTimeline()
    qtbot.addWidget(timeline)
    timeline.show_reply(finished_reply(reused=0))
    assert "cached" not in timeline.legend.text()

