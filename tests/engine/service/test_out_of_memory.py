"""Running out of memory mid-reply (simulated on the CPU): the partial reply is kept and the next prompt works."""

from __future__ import annotations

import pytest

from engine.forward.cpu_backend import FastLlamaBackend
from engine.protocol.messages import ChatMessage, Generate, ModelLoaded, ReplyFailed, SamplingParams, TokenStreamed


@pytest.fixture
def memory_limit(out_of_memory_after):
    return out_of_memory_after(FastLlamaBackend)


def test_out_of_memory_keeps_the_partial_reply_and_the_next_prompt_works(tiny_model_dir, engine_driver, memory_limit) -> None:
    engine = engine_driver()
    try:
        assert isinstance(engine.load(str(tiny_model_dir)), ModelLoaded)
        history = [ChatMessage("user", "Tell me about the quick brown fox")]
        memory_limit["forwards"] = 6  # the prefill and five decode steps
        engine.thread.submit(Generate("oom", "conv", tuple(history), SamplingParams(temperature=0, max_new_tokens=60)))
        streamed = ""
        while True:
            event = engine.wait_for(TokenStreamed, ReplyFailed)
            if isinstance(event, ReplyFailed):
                break
            streamed += event.text
        assert "out of memory" in event.message and "next message will work" in event.message
        assert event.partial_text == streamed and streamed
        memory_limit["forwards"] = None
        history.append(ChatMessage("assistant", event.partial_text))
        history.append(ChatMessage("user", "Go on"))
        after = engine.ask("conv", history)
        assert after.reply.stats.tokens_generated > 0
        assert after.prefill.reused_tokens == 0, "the broken reply's cache was freed, not reused"
    finally:
        engine.thread.stop()
