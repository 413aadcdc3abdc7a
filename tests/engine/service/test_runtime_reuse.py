"""Through the engine thread: KV reuse across turns, edits, regenerate and several conversations."""

from __future__ import annotations

import pytest

from engine.protocol.messages import (
    BatchSampled,
    Cancel,
    ChatMessage,
    ForgetConversation,
    Generate,
    LoadFailed,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.scheduler.block_pool import common_prefix_length

SHORT_GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


@pytest.fixture
def fresh(tiny_loaded, reply_alone):
    """``fresh(messages)``: the reply from an empty cache, alone: what the engine must say too.

    (A new conversation in the engine is not fresh: it reuses any cached prefix of any conversation.)
    """
    return lambda messages: reply_alone(tiny_loaded, _prompt_ids(tiny_loaded, messages), SHORT_GREEDY)


def _prompt_ids(tiny_loaded, messages: list[ChatMessage]) -> list[int]:
    return tiny_loaded.tokenize(tiny_loaded.render(messages))


def test_ten_turns_reuse_the_cache_and_match_a_fresh_cache(engine, tiny_loaded, fresh) -> None:
    history: list[ChatMessage] = []
    previous_prompt: list[int] = []
    for turn in range(10):
        history.append(ChatMessage("user", f"Hi {turn}"))
        reused = engine.ask("ten-turns", history)
        alone = fresh(history)
        prompt = _prompt_ids(tiny_loaded, history)
        assert reused.reply.text == alone.text
        assert alone.stats.reused_tokens == 0
        assert reused.prefill.prompt_tokens == len(prompt)
        assert len(previous_prompt) <= reused.prefill.reused_tokens < len(prompt)
        previous_prompt = prompt
        history.append(ChatMessage("assistant", reused.reply.text))


def test_editing_an_earlier_message_crops_the_cache_at_the_edit(engine, tiny_loaded, fresh) -> None:
    history = [ChatMessage("user", "Hi one"), ChatMessage("assistant", "a"), ChatMessage("user", "Hi two"),
               ChatMessage("assistant", "b"), ChatMessage("user", "Hi three")]
    engine.ask("edit", history)
    before = _prompt_ids(tiny_loaded, history)
    edited = history[:2] + [ChatMessage("user", "Hi EDITED")]
    after = _prompt_ids(tiny_loaded, edited)
    turn = engine.ask("edit", edited)
    assert turn.prefill.reused_tokens == common_prefix_length(before, after)
    assert turn.reply.text == fresh(edited).text


def test_regenerate_reuses_all_but_one_prompt_token_and_repeats_the_greedy_reply(engine, tiny_loaded) -> None:
    history = [ChatMessage("user", "Tell me about the fox")]
    first = engine.ask("regen", history)
    again = engine.ask("regen", history)
    assert again.prefill.reused_tokens == len(_prompt_ids(tiny_loaded, history)) - 1
    assert again.reply.text == first.reply.text


def test_switching_among_three_conversations_keeps_each_cache(engine, tiny_loaded, fresh) -> None:
    histories = {name: [] for name in ("a", "b", "c")}
    prompts = {name: [] for name in histories}
    for turn in range(3):
        for name, history in histories.items():
            history.append(ChatMessage("user", f"{name} says {turn}"))
            result = engine.ask(f"switch-{name}", history)
            assert result.reply.text == fresh(history).text
            assert result.prefill.reused_tokens >= len(prompts[name])
            if turn:
                assert result.prefill.reused_tokens > 0
            prompts[name] = _prompt_ids(tiny_loaded, history)
            history.append(ChatMessage("assistant", result.reply.text))


def test_overflow_drops_the_oldest_turns_and_says_which(engine) -> None:
    system = ChatMessage("system", "Be brief.")
    history = [system]
    for turn in range(40):
        history += [ChatMessage("user", f"The quick brown fox number {turn}"), ChatMessage("assistant", "Paris is the capital of France.")]
    history.append(ChatMessage("user", "And now?"))
    turn = engine.ask("overflow", history, SamplingParams(temperature=0, max_new_tokens=32))
    dropped = turn.prefill.dropped_turns
    assert dropped and dropped[0] == 1, "the oldest user turn goes first, the system prompt stays"
    assert list(dropped) == list(range(1, len(dropped) + 1))
    assert turn.prefill.prompt_tokens + 32 <= turn.prefill.context_length


def test_overflow_with_the_stop_policy_fails_with_a_clear_message(engine) -> None:
    history = [ChatMessage("user", "The quick brown fox " * 250)]
    engine.thread.submit(Generate("too-long", "stop-policy", tuple(history), SHORT_GREEDY, "stop"))
    failed = engine.wait_for(ReplyFailed)
    assert "context" in failed.message and "1024" in failed.message


def test_cancel_request_stops_a_reply_and_reports_it(engine) -> None:
    engine.thread.submit(Generate("long", "cancel", (ChatMessage("user", "Hi"),), SamplingParams(temperature=0, max_new_tokens=200)))
    engine.wait_for(TokenStreamed)
    engine.thread.submit(Cancel("long"))
    finished = engine.wait_for(ReplyFinished)
    assert finished.stats.finish_reason in ("cancelled", "eos")
    assert finished.stats.tokens_generated < 200


def test_a_broken_path_fails_to_load_and_the_model_stays(engine, tmp_path) -> None:
    failed = engine.load(str(tmp_path / "nothing-here"))
    assert isinstance(failed, LoadFailed)
    assert "nothing-here" in failed.message
    assert engine.ask("still-works", [ChatMessage("user", "Hi")]).reply.stats.tokens_generated > 0


def _next_pool_sample(engine) -> BatchSampled:
    return engine.wait_for(BatchSampled)


def test_forgetting_a_conversation_frees_its_own_blocks_and_keeps_the_shared_system_prompt(
        engine, tiny_loaded, fresh) -> None:
    system = ChatMessage("system", "You are Hearth, a patient assistant who answers in plain words. " * 4)
    apples, pears = [system, ChatMessage("user", "Tell me about apples")], [system, ChatMessage("user", "Tell me about pears")]
    engine.ask("forget-a", apples)
    first_pears = engine.ask("forget-b", pears)
    engine.thread.submit(ForgetConversation("forget-a"))
    before, after = _next_pool_sample(engine), _next_pool_sample(engine)  # the batch going idle, then the forgetting

    pears_again = engine.ask("forget-b", pears + [ChatMessage("assistant", first_pears.reply.text),
                                                  ChatMessage("user", "And their seeds?")])
    apples_again = engine.ask("forget-a2", apples)

    shared = common_prefix_length(_prompt_ids(tiny_loaded, apples), _prompt_ids(tiny_loaded, pears))
    assert shared >= 4 * 16, "the system prompt fills several blocks"
    assert after.pool.blocks_cached < before.pool.blocks_cached
    assert pears_again.prefill.reused_tokens >= len(_prompt_ids(tiny_loaded, pears)), "B's cache is whole"
    assert apples_again.prefill.reused_tokens == shared, "only what A shares with B is left of A"
    assert apples_again.reply.text == fresh(apples).text
