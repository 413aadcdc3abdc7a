"""Constrained replies in the batch: each says only what its constraint allows, ends when the constraint is
complete, and shares its steps with free replies that say what they say alone."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from engine.chat.grammar import constraint_error
from engine.chat.prompt import PromptPlan
from engine.protocol.messages import (
    ChatMessage,
    Constraint,
    Generate,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents

WARM = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=60, seed=7)
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
PHONE = r"[0-9]{3}-[a-z]{2,4}"


class _Recorder(list):
    def __call__(self, event) -> None:
        self.append(event)

    def finished(self, request_id: str) -> ReplyFinished:
        ends = [e for e in self if isinstance(e, (ReplyFinished, ReplyFailed)) and e.request_id == request_id]
        assert len(ends) == 1 and isinstance(ends[0], ReplyFinished), ends
        return ends[0]


def _prompt(tiny_loaded, text: str) -> list[int]:
    return tiny_loaded.tokenize(tiny_loaded.render((ChatMessage("user", text),)))


def _run(tiny_loaded, asks: dict[str, tuple[str, SamplingParams, Constraint | None]]) -> tuple[_Recorder, int]:
    """Every ask added to one fresh runner before its first step; the events, and the most replies in one step."""
    recorder = _Recorder()
    runner = BatchRunner(tiny_loaded, recorder, lambda request_id: False)
    for request_id, (text, sampling, constraint) in asks.items():
        prompt = _prompt(tiny_loaded, text)
        events = ReplyEvents(recorder, request_id, PromptPlan(prompt, ()), 0.0, 1024, 0.0)
        sampling = replace(sampling, stop=sampling.stop + tiny_loaded.template.stop_strings)
        runner.add(request_id, request_id, prompt, sampling, events, constraint)
    most = 0
    while runner.has_work:
        runner.step(lambda held: None)
        most = max(most, len(runner.scheduler.running))
    return recorder, most


def test_a_regex_reply_matches_it_and_ends_there(tiny_loaded) -> None:
    recorder, _ = _run(tiny_loaded, {"phone": ("Your number?", WARM, Constraint("regex", PHONE))})

    reply = recorder.finished("phone")
    assert re.fullmatch(PHONE, reply.text)
    assert reply.stats.finish_reason in ("constraint", "eos")


def test_a_choice_reply_is_one_of_the_choices(tiny_loaded) -> None:
    choices = ["apple pie", "banana split", "cherry"]
    asks = {f"pick{i}": ("Dessert?", replace(WARM, seed=i), Constraint("choice", json.dumps(choices))) for i in range(4)}
    recorder, _ = _run(tiny_loaded, asks)

    assert all(recorder.finished(request_id).text in choices for request_id in asks)


def test_a_lark_grammar_is_followed(tiny_loaded) -> None:
    grammar = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    recorder, _ = _run(tiny_loaded, {"tuple": ("Numbers?", replace(WARM, max_new_tokens=40), Constraint("grammar", grammar))})

    text = recorder.finished("tuple").text
    assert re.fullmatch(r"\(([0-9]{1,2},)*[0-9]{1,2}\)?", text), text  # a cut-off reply is a prefix


def test_constrained_and_free_replies_share_steps_and_each_is_right(tiny_loaded, reply_alone) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    asks = {
        "free0": ("Tell me about the fox", GREEDY, None),
        "json": ("Tell me about the fox", WARM, Constraint("json_schema", json.dumps(schema))),
        "free1": ("Paris and the capital of France", GREEDY, None),
        "phone": ("Paris and the capital of France", WARM, Constraint("regex", PHONE)),
    }
    recorder, most = _run(tiny_loaded, asks)

    assert most == 4
    value = json.loads(recorder.finished("json").text)
    assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 99 and isinstance(value["ok"], bool)
    assert re.fullmatch(PHONE, recorder.finished("phone").text)
    for request_id in ("free0", "free1"):
        alone = reply_alone(tiny_loaded, _prompt(tiny_loaded, asks[request_id][0]), GREEDY).text
        assert recorder.finished(request_id).text == alone


def test_logprobs_come_with_each_token_only_when_asked(tiny_loaded) -> None:
    asks = {"asked": ("Hi", replace(GREEDY, logprobs=2), None), "plain": ("Hi", GREEDY, None)}
    recorder, _ = _run(tiny_loaded, asks)

    streamed = {rid: [e for e in recorder if isinstance(e, TokenStreamed) and e.request_id == rid] for rid in asks}
    entries = [entry for event in streamed["asked"] for entry in event.logprobs]
    assert "".join(entry.chosen.token for entry in entries) == recorder.finished("asked").text
    assert all(len(entry.top) == 2 and entry.top[0].token == entry.chosen.token for entry in entries)  # greedy
    assert not any(event.logprobs for event in streamed["plain"])


def test_a_constrained_logprob_counts_only_the_allowed_tokens(tiny_loaded) -> None:
    sampling = replace(WARM, logprobs=5)
    recorder, _ = _run(tiny_loaded, {"yn": ("Yes or no?", sampling, Constraint("choice", '["yes", "no"]'))})

    first = next(e for e in recorder if isinstance(e, TokenStreamed) and e.request_id == "yn").logprobs[0]
    assert first.chosen.token in {t.token for t in first.top}
    assert sum(2.718281828 ** t.logprob for t in first.top) == pytest.approx(1.0, abs=1e-4)  # the mask's tokens


@pytest.mark.parametrize("constraint", [
    Constraint("regex", "("),
    Constraint("json_schema", "{not json"),
    Constraint("json_schema", '{"type": "frog"}'),
    Constraint("choice", "[]"),
    Constraint("grammar", "start: undefined_rule"),
    Constraint("yaml", ""),
])
def test_a_broken_constraint_is_named_before_it_runs(constraint) -> None:
    assert constraint_error(constraint)


def test_the_engine_refuses_a_broken_constraint_and_goes_on(engine_driver, tiny_model_dir) -> None:
    engine = engine_driver()
    try:
        engine.load(str(tiny_model_dir))
        messages = (ChatMessage("user", "hi"),)
        engine.thread.submit(Generate("bad", "c", messages, GREEDY, constraint=Constraint("regex", "(")))
        failed = engine.wait_for(ReplyFailed)
        engine.thread.submit(Generate("good", "c", messages, GREEDY, constraint=Constraint("regex", "[a-c]{2}")))
        good = engine.wait_for(ReplyFinished)
    finally:
        engine.thread.stop()

    assert failed.request_id == "bad" and "regex" in failed.message
    assert re.fullmatch("[a-c]{2}", good.text)


def test_the_one_at_a_time_runner_constrains_too(tiny_loaded) -> None:
    from transformers import AutoModelForCausalLM

    from engine.forward.backend import HFBackend
    from engine.service.sequence_runner import SequenceRunner

    hf_model = AutoModelForCausalLM.from_pretrained(tiny_loaded.path).eval()
    loaded = replace(tiny_loaded, backend=HFBackend(hf_model))
    recorder = _Recorder()
    runner = SequenceRunner(loaded, lambda request_id: False)
    prompt = _prompt(loaded, "Your number?")
    events = ReplyEvents(recorder, "phone", PromptPlan(prompt, ()), 0.0, 1024, 0.0)
    runner.add("phone", "phone", prompt, WARM, events, Constraint("regex", PHONE))
    while runner.has_work:
        runner.step(lambda held: None)

    assert re.fullmatch(PHONE, recorder.finished("phone").text)
