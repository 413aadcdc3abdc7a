"""A tiny random Llama with a real byte-level BPE tokenizer and a ChatML template, built once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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

    from engine.chat_template import ChatTemplate, find_folder_template
    from engine.loading import LoadPlan, load_model

    source, origin = find_folder_template(tiny_model_dir)
    plan = LoadPlan(tiny_model_dir, "tiny", torch.device("cpu"), "fp32", 1024, ChatTemplate(source, origin))
    return load_model(plan, lambda done, total: None, lambda: False)
