"""Log-probabilities in OpenAI's shapes: chat's ``logprobs.content`` and completions' four lists (server thread)."""

from __future__ import annotations

from typing import Sequence

from engine.protocol.messages import TokenChoice, TokenLogprob


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": None}``, a token an entry."""
    content = [{**_chat_choice(entry.chosen), "top_logprobs": [_chat_choice(c) for c in entry.top]} for entry in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], text_offset: int) -> dict:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; the first token starts at ``text_offset``
    characters into the completion."""
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry.chosen.token)
    return {
        "tokens": [entry.chosen.token for entry in entries],
        "token_logprobs": [entry.chosen.logprob for entry in entries],
        "top_logprobs": [_by_text(entry.top) for entry in entries],
        "text_offset": offsets,
    }


def _by_text(choices: Sequence[TokenChoice]) -> dict[str, float]:
    """``{token: logprob}``, best first; of tokens that read alike (parts of one character) the likeliest stays."""
    top: dict[str, float] = {}
    for choice in choices:
        top.setdefault(choice.token, choice.logprob)
    return top


def _chat_choice(choice: TokenChoice) -> dict:
    return {"token": choice.token, "logprob": choice.logprob, "bytes": list(choice.token_bytes)}
