"""Which tokens a constrained reply may say next: llguidance matchers over the model's vocabulary (engine thread).

``ConstraintVocabulary`` holds the loaded model's tokenizer as llguidance reads it,
built on the first constrained request (about half a second at 49 152 tokens), and
compiles each request's ``Constraint`` into a ``ConstraintMatcher``. ``allowed_tokens``
computes the masks of several matchers at once, on llguidance's own threads (it
releases the GIL, so a runner may call it beside a forward pass); each mask is a
bool tensor [T] over the tokenizer's T tokens, False where the token is refused
(``ReplyState.sample`` refuses the logits' tokens past T, an embedding's padding).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer

from engine.chat.grammar import ConstraintError, grammar_of
from engine.protocol.messages import Constraint


class ConstraintMatcher:
    """One reply's place in its constraint's grammar; advanced by each token the reply says."""

    def __init__(self, matcher: LLMatcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> None:
        """The reply said ``token`` (one its mask allowed); ``ConstraintError`` if the grammar refuses it."""
        if not self.matcher.consume_token(token):
            raise ConstraintError(f"The constraint refused token {token}: {self.matcher.get_error()}")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, the grammar would accept in turn from here (nothing is consumed)."""
        return self.matcher.validate_tokens(list(tokens))

    @property
    def complete(self) -> bool:
        """The grammar admits nothing more: the reply ends here."""
        return self.matcher.is_stopped()


class ConstraintVocabulary:
    """The model's tokenizer for llguidance, and the thread pool its masks are computed on."""

    def __init__(self, hf_tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._eos_ids = sorted(eos_ids)
        self._tokenizer: LLTokenizer | None = None
        self._executor: LLExecutor | None = None

    def matcher(self, constraint: Constraint) -> ConstraintMatcher:
        """``constraint`` compiled for this vocabulary; ``ConstraintError`` when it cannot be."""
        matcher = LLMatcher(self._vocabulary(), grammar_of(constraint), log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"The constraint cannot be used: {matcher.get_error()}")
        return ConstraintMatcher(matcher)

    def allowed_tokens(self, matchers: Sequence[ConstraintMatcher]) -> list[torch.Tensor]:
        """Each matcher's next-token mask, bool [T]."""
        vocab_size = self._vocabulary().vocab_size
        words = -(-vocab_size // 32)
        bitmask = np.zeros((len(matchers), words), dtype=np.int32)  # [N, words], bit t of the row: token t allowed
        rows = [(m.matcher, row) for row, m in enumerate(matchers)]
        self._executor.unsafe_compute_mask_ptr(rows, bitmask.ctypes.data, words * 4, len(matchers))
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab_size, bitorder="little")  # [N, T]
        return list(torch.from_numpy(bits.view(np.bool_)))

    def _vocabulary(self) -> LLTokenizer:
        if self._tokenizer is None:
            try:
                self._tokenizer = from_tokenizer(self._hf_tokenizer, eos_token=self._eos_ids or None)  # None: its own
            except ValueError as exc:  # a slow (Python) tokenizer: llguidance reads fast ones only
                raise ConstraintError(f"This model's tokenizer cannot be constrained: {exc}") from None
            self._executor = LLExecutor()
        return self._tokenizer
