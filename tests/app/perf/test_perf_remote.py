"""A model on a remote server: the panel keeps the server's own figures apart and claims no memory figures for it."""

from app.perf.state import PerfState
from engine.protocol.messages import MemorySampled, MemoryStats, ModelLoaded, RemoteFigures, ReplyFinished, RequestStats

LOCAL_MEMORY = MemoryStats("cpu", 1000, 20, 50, 4000, 6000, 10000, 900)
FIGURES = RemoteFigures("http://gpu:8000", "big", prompt_tokens=21, cached_tokens=16, decode_tok_s=64.0)


def test_a_remote_reply_keeps_the_servers_figures_and_no_memory_of_its_own():
    state = PerfState()
    state.apply(ModelLoaded("l1", "big", "big", "gpu:8000", "remote", 8192, 0.1, server="http://gpu:8000"))
    assert state.model.server == "http://gpu:8000" and state.memory is None

    state.apply(MemorySampled(LOCAL_MEMORY, 1.0))  # this machine's memory, sampled by the embedded engine
    state.apply(ReplyFinished("r1", "Paris", RequestStats(ttft_ms=80.0, tokens_generated=5, remote=FIGURES)))

    assert state.reply.remote == FIGURES and state.reply.ttft_ms == 80.0
    assert state.memory == LOCAL_MEMORY


def test_a_local_model_after_a_remote_one_shows_its_memory_again():
    state = PerfState()
    state.apply(ModelLoaded("l1", "big", "big", "gpu:8000", "remote", 8192, 0.1, server="http://gpu:8000"))
    state.apply(ModelLoaded("l2", "small", "/m/small.gguf", "cpu", "fp32", 2048, 0.5, LOCAL_MEMORY))

    assert state.model.server == "" and state.memory == LOCAL_MEMORY
