"""Engine fixtures: a tiny random Llama with a real byte-level BPE tokenizer and a ChatML template,
built once per session, and a driver for the real engine thread (test thread + engine thread)."""

from __future__ import annotations

import json
import queue
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from engine.protocol.messages import (
    ChatMessage,
    Generate,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    PrefillDone,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
)
from engine.service.worker import EngineThread

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "Hearth runs language models on your own machine, fast and private.",
    "def main():\n    return 42\n",
    "Emoji 🔥🙂 and CJK 你好世界 日本語 한국어 are text too.",
] * 20


def _train_tokenizer(folder: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)


def _save_model(folder: Path, vocab_size: int, eos_id: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        eos_token_id=eos_id, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so greedy text varies with context
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    _train_tokenizer(folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    eos_id = next(t["id"] for t in added if t["content"] == "<|im_end|>")
    _save_model(folder, max(len(vocab), max(t["id"] for t in added) + 1), eos_id)
    return folder


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path):
    """The tiny model loaded the way the engine loads models (fp32, CPU)."""
    import torch

    from engine.chat.chat_template import ChatTemplate, find_folder_template
    from engine.models.loading import LoadPlan, load_model

    source, origin = find_folder_template(tiny_model_dir)
    plan = LoadPlan(tiny_model_dir, "tiny", torch.device("cpu"), "fp32", 1024, ChatTemplate(source, origin))
    return load_model(plan, lambda done, total: None, lambda: False)


SHORT_GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


def _reply_alone(loaded, prompt_ids: list[int], sampling: SamplingParams):
    from engine.bench.runner_replies import ReplyDriver

    sampling = replace(sampling, stop=sampling.stop + loaded.template.stop_strings)
    driver = ReplyDriver(loaded, len(prompt_ids) + sampling.max_new_tokens)
    return driver.reply(prompt_ids, sampling.max_new_tokens, sampling=sampling)


@pytest.fixture(scope="session")
def reply_alone():
    """``reply_alone(loaded, prompt_ids, sampling)``: the prompt answered alone by a fresh batch runner of ``loaded``
    (``ReplyDriver``, a pool just big enough), stopping on the template's stop strings as the runtime does: what the
    engine must say for it too. Returns its ``Reply`` (text and stats); a failed reply raises."""
    return _reply_alone


@dataclass
class Turn:
    prefill: PrefillDone
    reply: ReplyFinished


class EngineDriver:
    """The real engine thread and runtime, driven synchronously."""

    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()
        self.thread = EngineThread(self.events.put)
        self.thread.start()

    def wait_for(self, *kinds, timeout: float = 120):
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, kinds):
                return event

    def load(self, path: str):
        self.thread.submit(LoadModel("load", path))
        return self.wait_for(ModelLoaded, LoadFailed)

    def ask(self, conversation_id: str, messages: list[ChatMessage], sampling=SHORT_GREEDY, overflow="drop_oldest") -> Turn:
        self.thread.submit(Generate(uuid.uuid4().hex, conversation_id, tuple(messages), sampling, overflow))
        prefill = self.wait_for(PrefillDone, ReplyFailed)
        if isinstance(prefill, ReplyFailed):
            raise AssertionError(prefill.message)
        return Turn(prefill, self.wait_for(ReplyFinished))




@pytest.fixture(scope="session")
def engine_driver():
    """The ``EngineDriver`` class: ``engine_driver()`` starts a real engine thread."""
    return EngineDriver


@pytest.fixture
def out_of_memory_after(monkeypatch):
    """``limit = out_of_memory_after(BackendClass)``; then ``limit["forwards"] = N`` lets N more forward passes run
    (single-stream ``forward`` or batched ``forward_batch``, one step each) and raises CUDA's out-of-memory error on
    the next one; ``None`` lifts the limit."""
    import torch

    def install(backend_class: type) -> dict[str, int | None]:
        limit: dict[str, int | None] = {"forwards": None}

        def limited(real_forward):
            def forward(self, *args):
                if limit["forwards"] is not None:
                    if limit["forwards"] <= 0:
                        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
                    limit["forwards"] -= 1
                return real_forward(self, *args)
            return forward

        for name in ("forward", "forward_batch"):
            if hasattr(backend_class, name):
                monkeypatch.setattr(backend_class, name, limited(getattr(backend_class, name)))
        return limit

    return install


@pytest.fixture
def host_features(monkeypatch: pytest.MonkeyPatch):
    """``host_features(**changes)``: formats are then planned for this CPU with ``changes`` to its features
    (``format_plan.HostFeatures``), e.g. ``amx_tiles=False``; returns the features planned for."""
    from dataclasses import replace

    from engine.models import format_plan

    def plan_for(**changes: bool) -> format_plan.HostFeatures:
        features = replace(format_plan.this_host(), **changes)
        monkeypatch.setattr(format_plan, "this_host", lambda: features)
        return features

    return plan_for


@pytest.fixture
def without_prompt_kernels(host_features) -> None:
    """``auto`` as a CPU without Hearth's int4 prompt kernels chooses (AMX's tiles, the x86 variants' strips: an ARM
    CPU, say): there a small 4-bit file keeps an fp16 copy for its prompts where memory allows."""
    host_features(amx_tiles=False, prompt_kernel=False)
