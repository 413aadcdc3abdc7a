"""The panel shows a finished reply's speculative drafts: how many were drafted and accepted, and tokens per step."""

from __future__ import annotations

from dataclasses import replace

from app.perf.format import UNKNOWN
from tests.app.perf.test_perf_panel import ScriptedEngine, feed, label_text


def test_a_finished_reply_shows_its_drafts_and_tokens_per_step(panel, qtbot):
    engine = ScriptedEngine()
    streaming = [engine.prefill("r1", 500, 0), *engine.tokens("r1", 60)]
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        feed(panel, engine.load() + streaming)
    assert label_text(panel, "drafts") == label_text(panel, "tokens_per_step") == UNKNOWN  # known at the end
    finished = engine.finish("r1", 500, 0, 60)
    finished = replace(finished, stats=replace(finished.stats, drafted_tokens=40, accepted_tokens=31, decode_steps=25))
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        feed(panel, [finished])
    assert label_text(panel, "drafts") == "31 of 40 accepted (78%)"
    assert label_text(panel, "tokens_per_step") == "2.4"


def test_a_reply_without_drafts_says_none_and_one_token_a_step(panel, qtbot):
    engine = ScriptedEngine()
    finished = engine.finish("r1", 500, 0, 60)
    finished = replace(finished, stats=replace(finished.stats, decode_steps=60))
    with qtbot.waitSignal(panel.refreshed, timeout=1000):
        feed(panel, engine.load() + [engine.prefill("r1", 500, 0), *engine.tokens("r1", 60), finished])
    assert label_text(panel, "drafts") == "none"
    assert label_text(panel, "tokens_per_step") == "1.0"
