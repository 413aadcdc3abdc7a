"""Running out of memory mid-reply (simulated on the CPU): the partial reply is kept and the next prompt works."""

from __future__ import annotations

import pytest
import torch

from engine.fast_llama import FastLlamaBackend
from engine.messages import ChatMessage, Generate, ModelLoaded, ReplyFailed, SamplingParams, TokenStreamed


@pytest.fixture
def memory_limit(monkeypatch):
    """``limit["forwards"] = N`` lets N more forward passes run, then raises CUDA's out-of-memory error."""
    limit: dict[str, int | None] = {"forwards": None}
    real_forward = FastLlamaBackend.forward

    def limited_forward(self, token_ids, cache, start):
        if limit["forwards"] is not None:
            if limit["forwards"] <= 0:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
            limit["forwards"] -= 1
        return real_forward(self, token_ids, cache, start)

    monkeypatch.setattr(FastLlamaBackend, "forward", limited_forward)
    return limit


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
