"""The GPU backend's batched steps, run eagerly on the CPU (graphs off): bucket steps over a block pool give each
sequence what it gets alone; padding rows change nothing; the batch runner drives it. The graphs need a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.bench.runner_replies import ReplyDriver
from engine.chat.prompt import PromptPlan
from engine.forward.cpu_backend import FastLlamaBackend
from engine.forward.cuda_backend import CudaLlama, CudaLlamaBackend
from engine.forward.llama_forward import FastLlama
from engine.forward.cuda_batch import BUCKETS, DevicePool, bucket_for, fits_a_bucket
from engine.forward.paged_kv import BatchRow
from engine.host.memory import KV_CACHE_BUDGET_BYTES, kv_pool_budget, read_memory
from engine.models.random_models import build_hf_model
from engine.protocol.messages import ReplyFinished, SamplingParams
from engine.service.batch_runner import BatchRunner
from engine.service.reply_events import ReplyEvents
from tests.engine.forward.batch_of_one import greedy_tokens
from tests.engine.forward.triton_interpreter import assert_passes_in_the_interpreter
from tests.engine.forward.formats import fast_plan

CPU = torch.device("cpu")
BLOCK = 4
PROMPTS = ([5, 6, 7], list(range(20, 29)), list(range(40, 54)))
TABLES = ([7, 2, 30, 31, 50, 51], [0, 1, 22, 40, 41, 42], [10, 11, 12, 13, 14, 15])  # scattered and consecutive


def gpu_style_backend(device: torch.device = CPU, use_graphs: bool = False) -> CudaLlamaBackend:
    hf_model = build_hf_model("tiny", CPU, torch.float32)
    model = CudaLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", device), device)
    return CudaLlamaBackend(model, 1024, use_graphs)


@pytest.fixture(scope="module")
def backend() -> CudaLlamaBackend:
    return gpu_style_backend()


def greedy_batched(backend: CudaLlamaBackend, count: int) -> list[list[int]]:
    """The prompts prefilled in one batched step, then ``count`` tokens each, decoded in bucket steps."""
    pool = backend.new_pool(64, BLOCK)
    logits = backend.forward_batch([BatchRow(p, 0, t) for p, t in zip(PROMPTS, TABLES)], pool)
    replies = [[int(row.argmax())] for row in logits]
    for _ in range(count - 1):
        rows = [BatchRow(r[-1:], len(p) + len(r) - 1, t) for p, r, t in zip(PROMPTS, replies, TABLES)]
        assert fits_a_bucket(rows, pool)
        for reply, row in zip(replies, backend.forward_batch(rows, pool)):
            reply.append(int(row.argmax()))
    return replies


def test_bucket_steps_give_each_sequence_the_cpu_paths_greedy_tokens_alone(backend):
    hf_model = build_hf_model("tiny", CPU, torch.float32)
    on_cpu = FastLlamaBackend(FastLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU))
    assert greedy_batched(backend, 12) == [greedy_tokens(on_cpu, prompt, 12) for prompt in PROMPTS]


def test_padding_rows_leave_the_real_rows_logits_unchanged(backend):
    """Three rows run in bucket 4 (one padding row) and each alone in bucket 1, on pools with the same prefill."""
    pools = [backend.new_pool(64, BLOCK) for _ in range(2)]
    for pool in pools:
        backend.forward_batch([BatchRow(p, 0, t) for p, t in zip(PROMPTS, TABLES)], pool)
    rows = [BatchRow([3], len(p), t) for p, t in zip(PROMPTS, TABLES)]
    together = backend.forward_batch(rows, pools[0])
    alone = torch.cat([backend.forward_batch([row], pools[1]) for row in rows])
    assert set(pools[0].steps) == {4} and set(pools[1].steps) == {1}
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)  # matmuls of 4 rows and of 1 sum in other orders


def test_buckets_and_what_fits_them(backend):
    assert [bucket_for(n) for n in (1, 3, 8, 9, 32, 33)] == [1, 4, 8, 16, 32, None]
    pool = backend.new_pool(8, BLOCK)
    assert isinstance(pool, DevicePool) and pool.scratch_block == 8 and pool.table_width == 1024 // BLOCK
    assert pool.buffer.shape[3] == 9 * BLOCK, "one scratch block past the scheduler's"
    one = BatchRow([1], 5, [0, 1])
    assert fits_a_bucket([one], pool) and not fits_a_bucket([BatchRow([1, 2], 5, [0, 1])], pool)
    assert not fits_a_bucket([one] * (BUCKETS[-1] + 1), pool)
    assert not fits_a_bucket([BatchRow([1], 5, list(range(pool.table_width + 1)))], pool)


def test_the_batch_runner_over_the_gpu_backend_says_what_each_request_says_alone(tiny_loaded, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = CudaLlama(hf_model.config, hf_model.state_dict(), fast_plan(hf_model.config, "fp32", CPU), CPU)
    gpu = replace(tiny_loaded, backend=CudaLlamaBackend(model, 1024, use_graphs=False), eos_ids=frozenset())
    finished: dict[str, ReplyFinished] = {}

    def emit(event) -> None:
        if isinstance(event, ReplyFinished):
            finished[event.request_id] = event

    runner = BatchRunner(gpu, emit, lambda _: False)
    assert (runner.scheduler.max_running, runner.scheduler.step_tokens) == (BUCKETS[-1], 256), "the GPU's sizes"
    sampling = SamplingParams(temperature=0, max_new_tokens=10)
    prompts = [gpu.tokenize(f"Tell me about {topic}") for topic in ("foxes", "the sea", "Hearth and home", "x")]
    for index, prompt in enumerate(prompts):
        events = ReplyEvents(emit, f"r{index}", PromptPlan(prompt, ()), 0.0, gpu.context_length, 0.0)
        runner.add(f"r{index}", f"c{index}", prompt, sampling, events)
    while runner.has_work:
        runner.step(lambda held: read_memory("cpu", 0, held, 0))
    assert runner.kv.steps, "decode steps ran as bucket steps"
    for index, prompt in enumerate(prompts):
        assert finished[f"r{index}"].text == ReplyDriver(gpu, 512).reply(prompt, 10).text, "as a batch of one"


def test_bucket_steps_with_the_triton_kernel_in_the_interpreter_match_the_torch_attention():
    script = (
        "from engine.forward.paged_attention import paged_decode_attention\n"
        "from tests.engine.forward.test_cuda_batch import gpu_style_backend, greedy_batched\n"
        "backend = gpu_style_backend()\n"
        "expected = greedy_batched(backend, 4)\n"
        "backend.decode_attention = paged_decode_attention\n"
        "assert greedy_batched(backend, 4) == expected\n"
        "print('ok')\n"
    )
    assert_passes_in_the_interpreter(script)


@pytest.mark.gpu
def test_captured_bucket_graphs_give_the_eager_steps_tokens():
    graphed, eager = gpu_style_backend(torch.device("cuda"), True), gpu_style_backend(torch.device("cuda"), False)
    graphed.check_graphs()
    assert graphed.runner.disabled_reason is None
    assert greedy_batched(graphed, 12) == greedy_batched(eager, 12)


def test_the_pool_budget_off_a_gpu_is_the_cpus_share_of_free_memory(monkeypatch):
    from engine.host import memory

    monkeypatch.setattr(memory, "device_memory", lambda _device: (0, 64 * KV_CACHE_BUDGET_BYTES, 0))
    assert kv_pool_budget("cpu") == 64 * KV_CACHE_BUDGET_BYTES // memory.CPU_SPARE_SHARE


@pytest.mark.gpu
def test_the_pool_budget_on_a_gpu_is_half_its_free_memory():
    free = torch.cuda.mem_get_info()[0]
    assert free // 2 <= kv_pool_budget("cuda") <= free
