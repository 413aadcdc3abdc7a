"""Replies with drafts say what they say without them, with the same log-probabilities (the built-in model, greedy):
beside other streams that join at different steps, and ending exactly where a stop string, the end of the sequence or
the token budget ends them when that falls inside an accepted draft."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from engine.chat.prompt import PromptPlan
from engine.host.memory import read_memory
from engine.models.model_open import open_model
from engine.protocol.messages import (
    GREEDY,
    ChatMessage,
    Constraint,
    LoadOptions,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenLogprob,
    TokenStreamed,
)
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents

CODE = """def area(width, height):
    return width * height

def perimeter(width, height):
    return 2 * (width + height)
"""
REWRITE = f"Rename the parameter width to w in this code and repeat the whole code:\n\n{CODE}"
SENTENCE = "Repeat this sentence exactly: the small cat sat on the warm mat by the old red door."
CHAT = "What is the capital of France?"
JOINS = ((0, REWRITE), (3, CHAT), (7, SENTENCE))  # (step at which it joins, what the user asks)
NEW_TOKENS = 40


def _open(path: Path, precision: str):
    return open_model(str(path), LoadOptions("cpu", precision), lambda _: None, lambda *_: None, lambda: False)


@pytest.fixture(scope="module")
def built_in_fp32(default_model_path: Path):
    """The built-in model in fp32: a step's arithmetic is the same however many sequences share it, so a stream's
    text does not depend on which others run beside it."""
    return _open(default_model_path, "fp32")


@pytest.fixture(scope="module")
def built_in(default_model_path: Path):
    """The built-in model as the app loads it (its 4-bit copy decodes), for a single stream."""
    return _open(default_model_path, "auto")


@pytest.fixture(scope="module")
def rewrite(built_in) -> Said:
    """The rewrite's reply alone, without drafts."""
    return Batch(built_in).run(((0, REWRITE),), replace(GREEDY, max_new_tokens=NEW_TOKENS, speculative=False))["r0"]


@dataclass
class Said:
    text: str
    finished: ReplyFinished
    logprobs: list[TokenLogprob]  # each said token's, where asked


class Batch:
    """A batch runner over ``loaded`` driven step by step; requests join at chosen steps."""

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.ended: dict[str, ReplyFinished | ReplyFailed] = {}
        self.runner = BatchRunner(loaded, self._emit, lambda _: False, budget_bytes=256 * 1024 * 1024)
        self.events: dict[str, ReplyEvents] = {}
        self.logprobs: dict[str, list[TokenLogprob]] = {}

    def _emit(self, event) -> None:
        if isinstance(event, (ReplyFinished, ReplyFailed)):
            self.ended[event.request_id] = event
        if isinstance(event, TokenStreamed):
            self.logprobs.setdefault(event.request_id, []).extend(event.logprobs)

    def add(self, request_id: str, question: str, sampling: SamplingParams, constraint: Constraint | None) -> None:
        prompt = self.loaded.tokenize(self.loaded.render((ChatMessage("user", question),)))
        events = ReplyEvents(self._emit, request_id, PromptPlan(prompt, ()), 0.0, self.loaded.context_length,
                             time.perf_counter())
        sampling = replace(sampling, stop=sampling.stop + self.loaded.template.stop_strings)
        self.runner.add(request_id, request_id, prompt, sampling, events, constraint)
        self.events[request_id] = events

    def run(self, joins, sampling: SamplingParams, constraint: Constraint | None = None) -> dict[str, Said]:
        step = 0
        pending = list(joins)
        while pending or self.runner.has_work:
            while pending and pending[0][0] <= step:
                self.add(f"r{len(self.events)}", pending.pop(0)[1], sampling, constraint)
            self.runner.step(lambda held: read_memory("cpu", 0, held, held))
            step += 1
        failed = [e.message for e in self.ended.values() if isinstance(e, ReplyFailed)]
        assert not failed, failed
        return {request_id: Said(events.text, self.ended[request_id], self.logprobs.get(request_id, []))
                for request_id, events in self.events.items()}


def _replies(loaded, joins, sampling: SamplingParams,
             constraint: Constraint | None = None) -> tuple[dict[str, Said], dict[str, Said]]:
    """The replies without drafts, then with."""
    return (Batch(loaded).run(joins, replace(sampling, speculative=False), constraint),
            Batch(loaded).run(joins, replace(sampling, speculative=True), constraint))


def test_streams_joining_a_drafting_batch_say_what_they_say_without_drafts(built_in_fp32):
    plain, drafted = _replies(built_in_fp32, JOINS, replace(GREEDY, max_new_tokens=NEW_TOKENS, logprobs=2))
    assert {r: s.text for r, s in drafted.items()} == {r: s.text for r, s in plain.items()}
    for request_id, said in drafted.items():  # a drafted token's log-probabilities are its own row's
        expected = plain[request_id].logprobs
        assert [lp.chosen.token for lp in said.logprobs] == [lp.chosen.token for lp in expected]
        assert [lp.chosen.logprob for lp in said.logprobs] == pytest.approx([lp.chosen.logprob for lp in expected],
                                                                            abs=1e-3)
    rewrite = drafted["r0"].finished.stats
    assert rewrite.accepted_tokens > NEW_TOKENS // 3  # the rewrite copies the code: most of it is drafted
    assert rewrite.decode_steps < rewrite.tokens_generated * 2 // 3
    assert plain["r0"].finished.stats.decode_steps == plain["r0"].finished.stats.tokens_generated


def test_a_stop_string_inside_an_accepted_draft_ends_the_reply_where_it_would_without(built_in, rewrite):
    stop = "def perimeter"  # in the copied code, after its first function: drafted and accepted there
    assert stop in rewrite.text
    sampling = replace(GREEDY, max_new_tokens=NEW_TOKENS, stop=(stop,), speculative=True)
    drafted = Batch(built_in).run(((0, REWRITE),), sampling)["r0"]
    assert drafted.text == rewrite.text.split(stop)[0]
    assert drafted.finished.stats.finish_reason == "stop_string"
    assert drafted.finished.stats.accepted_tokens > 0


@pytest.mark.parametrize("ending", ["eos", "max_tokens"])
def test_the_end_of_sequence_or_the_budget_inside_an_accepted_draft_ends_the_reply_there(built_in, rewrite, ending):
    sampling = replace(GREEDY, max_new_tokens=NEW_TOKENS)
    cut = 30  # a token late in the copy
    if ending == "eos":
        token = built_in.tokenize(rewrite.text)[cut]
        loaded = replace(built_in, eos_ids=built_in.eos_ids | {token})
    else:
        loaded, sampling = built_in, replace(sampling, max_new_tokens=cut)
    plain, drafted = _replies(loaded, ((0, REWRITE),), sampling)
    assert drafted["r0"].text == plain["r0"].text
    stats, plain_stats = drafted["r0"].finished.stats, plain["r0"].finished.stats
    assert (stats.finish_reason, stats.tokens_generated) == (plain_stats.finish_reason, plain_stats.tokens_generated)
    assert stats.finish_reason == ending and stats.accepted_tokens > 0


def test_a_constrained_reply_drafts_within_its_grammar_and_says_what_it_says_without(built_in_fp32):
    """Each drafted row is sampled under the mask of the grammar's state after the tokens before it."""
    lowercase = Constraint("regex", "[a-z .]{1,120}")
    plain, drafted = _replies(built_in_fp32, ((0, SENTENCE), (2, SENTENCE)), replace(GREEDY, max_new_tokens=NEW_TOKENS),
                              lowercase)
    for request_id, said in drafted.items():
        assert said.text == plain[request_id].text
        assert re.fullmatch("[a-z .]{1,120}", said.text), said.text
        assert said.finished.stats.accepted_tokens > 0, "the sentence is copied: its words are drafted"


STORY = "Tell me a short story about a lighthouse keeper who finds a message in a bottle."  # little to look up


def _drafting_for_itself(path: Path, precision: str):
    """The built-in model at ``precision`` with the built-in model (as the app loads it) drafting for it."""
    options = LoadOptions("cpu", precision, draft_model=str(path))
    return open_model(str(path), options, lambda _: None, lambda *_: None, lambda: False)


@pytest.fixture(scope="module")
def self_drafting(default_model_path: Path):
    loaded = _drafting_for_itself(default_model_path, "auto")
    assert loaded.draft is not None, loaded.notices
    return loaded


def test_the_built_in_model_drafting_for_itself_says_the_same_text_and_most_drafts_are_accepted(self_drafting):
    sampling = replace(GREEDY, max_new_tokens=NEW_TOKENS)
    joins = ((0, STORY),)
    plain = Batch(self_drafting).run(joins, replace(sampling, speculative=False))["r0"]
    drafted = Batch(self_drafting).run(joins, replace(sampling, speculative=True))["r0"]
    assert drafted.text == plain.text
    stats = drafted.finished.stats
    assert stats.drafted_tokens >= 8, "the draft model drafts where prompt lookup finds nothing"
    assert stats.accepted_tokens / stats.drafted_tokens > 0.8
    assert stats.decode_steps < stats.tokens_generated


def test_streams_joining_a_batch_drafted_by_a_model_each_say_what_they_say_alone(default_model_path, built_in_fp32):
    """fp32 steps: a stream's arithmetic does not depend on which others run beside it, drafted or not."""
    sampling = replace(GREEDY, max_new_tokens=NEW_TOKENS)
    alone = {f"r{index}": Batch(built_in_fp32).run(((0, question),), replace(sampling, speculative=False))["r0"].text
             for index, (_, question) in enumerate(JOINS)}
    drafting = _drafting_for_itself(default_model_path, "fp32")
    drafted = Batch(drafting).run(JOINS, replace(sampling, speculative=True))
    assert {request_id: said.text for request_id, said in drafted.items()} == alone
    assert all(said.finished.stats.accepted_tokens > 0 for said in drafted.values())
