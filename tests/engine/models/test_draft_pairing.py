"""A draft model must share the model's tokenizer: one with another vocabulary is refused with a notice saying why,
and the model loads and answers without it (the tiny model, whose 400-odd tokens are not the built-in model's)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine.forward.backend import HFBackend
from engine.models.draft_pairing import target_refused, vocabulary_difference, with_draft
from engine.protocol.messages import ChatMessage, LoadModel, LoadOptions, ModelLoaded


def test_a_draft_model_with_another_vocabulary_is_refused_and_the_model_still_loads_and_answers(
        tiny_model_dir: Path, default_model_path: Path, engine_driver):
    driver = engine_driver()
    try:
        options = LoadOptions("cpu", draft_model=str(default_model_path))
        driver.thread.submit(LoadModel("load", str(tiny_model_dir), options))
        loaded = driver.wait_for(ModelLoaded)
        assert loaded.draft_model == ""
        refusal = next(notice for notice in loaded.notices if notice.startswith("The draft model "))
        assert refusal.endswith("is not used: its tokenizer has 49,152 tokens, the model's 400.")
        assert driver.ask("c", [ChatMessage("user", "Paris")]).reply.stats.tokens_generated > 0
    finally:
        driver.thread.stop()


def test_tokenizers_that_differ_only_in_ids_or_special_tokens_are_told_apart(tiny_loaded):
    tokenizer = tiny_loaded.tokenizer
    assert vocabulary_difference(tokenizer, tokenizer) is None
    vocab = tokenizer.get_vocab()
    swapped = _Vocabulary({**vocab, next(iter(vocab)): len(vocab)}, tokenizer.all_special_ids)
    assert vocabulary_difference(tokenizer, swapped) == "1 of its tokenizer's tokens have other ids than the model's"
    other_end = _Vocabulary(tokenizer.get_vocab(), [0, 1])
    assert "special tokens" in vocabulary_difference(tokenizer, other_end)


def test_a_draft_model_of_the_same_tokenizer_is_paired_and_its_memory_said(tiny_loaded):
    paired = with_draft(tiny_loaded, tiny_loaded)
    assert paired.draft is tiny_loaded
    assert paired.held_weight_bytes == 2 * tiny_loaded.weight_bytes
    assert paired.notices[-1].startswith("Drafting with tiny: ")
    assert "of KV cache (2,048 positions) beside the model" in paired.notices[-1]  # two of its 1 024-token contexts


def test_a_model_on_the_transformers_fallback_takes_no_draft_model(tiny_loaded, tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    on_transformers = replace(tiny_loaded, backend=HFBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir)))
    assert "transformers" in target_refused(on_transformers)
    assert target_refused(tiny_loaded) is None


class _Vocabulary:
    """What ``vocabulary_difference`` reads of a tokenizer."""

    def __init__(self, vocab: dict[str, int], special_ids: list[int]) -> None:
        self._vocab = vocab
        self.all_special_ids = special_ids

    def get_vocab(self) -> dict[str, int]:
        return self._vocab
