"""Renders a conversation into prompt token ids that fit the context window (engine thread).

When history plus the reply budget exceeds the context, the default policy keeps
the system prompt and the newest turns and drops the oldest; the other policy
refuses with a clear message. Either way the caller learns which turns went.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from engine.protocol.messages import ChatMessage, OverflowPolicy

Render = Callable[[Sequence[ChatMessage]], str]
Tokenize = Callable[[str], list[int]]


class ContextOverflow(Exception):
    """The conversation cannot fit the model's context window under the chosen policy."""


@dataclass(frozen=True)
class PromptPlan:
    token_ids: list[int]
    dropped_turns: tuple[int, ...]  # indices into the request's messages


def reply_budget(max_new_tokens: int, context_length: int) -> int:
    """Room kept for the reply: what the user asked for, but never more than half the context."""
    return max(1, min(max_new_tokens, context_length // 2))


def plan_prompt(
    messages: Sequence[ChatMessage],
    render: Render,
    tokenize: Tokenize,
    context_length: int,
    budget: int,
    policy: OverflowPolicy,
) -> PromptPlan:
    limit = context_length - budget
    kept = list(range(len(messages)))
    ids = tokenize(render(messages))
    while len(ids) > limit:
        droppable = _oldest_droppable(messages, kept)
        if policy == "stop" or droppable is None:
            raise ContextOverflow(_overflow_message(len(ids), budget, context_length, policy))
        kept = [i for i in kept if i not in droppable]
        ids = tokenize(render([messages[i] for i in kept]))
    dropped = tuple(i for i in range(len(messages)) if i not in kept)
    return PromptPlan(ids, dropped)


def plan_raw_prompt(text: str, tokenize: Tokenize, context_length: int, budget: int) -> PromptPlan:
    """Raw text to continue, without a chat template; nothing can be dropped, so too long is refused."""
    ids = tokenize(text)
    if not ids:
        raise ContextOverflow("The prompt is empty: give the model some text to continue.")
    if len(ids) > context_length - budget:
        raise ContextOverflow(
            f"The prompt needs {len(ids)} tokens plus {budget} for the reply, but the model's context "
            f"holds {context_length}. Shorten the prompt or lower max_tokens."
        )
    return PromptPlan(ids, ())


def _oldest_droppable(messages: Sequence[ChatMessage], kept: list[int]) -> set[int] | None:
    """The oldest user turn still kept and what answered it before the next user turn (the assistant's reply, its
    tool calls and their results, which mean nothing apart); never the system prompt or the last message."""
    candidates = [i for i in kept[:-1] if messages[i].role != "system"]
    if not candidates:
        return None
    first = candidates[0]
    drop = {first}
    if messages[first].role == "user":
        for i in candidates[1:]:
            if messages[i].role == "user":
                break
            drop.add(i)
    return drop


def _overflow_message(prompt_tokens: int, budget: int, context_length: int, policy: OverflowPolicy) -> str:
    if policy == "stop":
        return (
            f"This conversation needs {prompt_tokens} tokens plus {budget} for the reply, "
            f"but the model's context holds {context_length}. Start a new conversation, "
            "shorten the messages, or let Hearth drop the oldest turns."
        )
    return (
        f"The last message alone needs {prompt_tokens} tokens plus {budget} for the reply, "
        f"more than the model's context of {context_length}. Shorten the message or lower the reply length."
    )
