"""One round of the tool calls a reply made: a card for each, the user's approval, the call (GUI thread, qasync loop).

``ToolRound.run`` takes the calls of a finished reply one after another. Each gets a "tool" turn in
the conversation (its card), saved at once. A call to a tool the hub does not offer, or whose
arguments are not a JSON object, ends at once as an error; any other waits for the user's answer on
its card (``answer``: Allow once, Always allow or Deny) unless the hub always allows that tool, then
runs through the hub within ``TOOL_TIMEOUT_S``. The turn's text is what the model reads next: the
result, what went wrong, or that the user denied the call. After Stop cancels ``run``, ``stop`` marks
the call in progress and those not reached as stopped, so every call the reply made keeps its answer.
``skip`` answers each call with a note that it was not run (the reply reached its limit of rounds).
``turn_added`` and ``turn_changed`` tell ``ChatSession`` which cards to draw; a failed save is a
``notice`` and the round goes on (the card on screen is what the model reads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QObject, Signal

from app.conversations.conversation import Conversation, DisplayMessage
from app.conversations.persistence import ConversationJournal
from app.storage import StorageError
from app.storage.records import ToolStatus, ToolTurn
from engine.protocol.messages import ToolCall

if TYPE_CHECKING:
    from app.tools.hub import ToolHub, ToolSpec

ToolAnswer = Literal["allow_once", "allow_always", "deny"]
TOOL_ANSWERS: tuple[ToolAnswer, ...] = ("allow_once", "allow_always", "deny")
TOOL_TIMEOUT_S = 60.0
DENIED = "The user denied this tool call."
STOPPED = "The user stopped this tool call before it finished; it has no result."


def skipped_text(limit: int) -> str:
    return f"Not run: this reply reached its limit of {limit} rounds of tool calls."


class ToolRound(QObject):
    """Runs the tool calls of finished replies, in whichever conversation; answers approvals by card."""

    turn_added = Signal(object, object)
    """A ``Conversation`` and the "tool" ``DisplayMessage`` just added to it."""
    turn_changed = Signal(object, object)
    """A ``Conversation`` and its "tool" ``DisplayMessage`` whose call moved on."""
    notice = Signal(str)

    def __init__(self, journal: ConversationJournal, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._journal = journal
        self._questions: list[tuple[DisplayMessage, asyncio.Future[ToolAnswer]]] = []
        """The cards waiting for the user's answer, each with the future the answer resolves."""

    def answer(self, message: DisplayMessage, choice: ToolAnswer) -> None:
        """The user's answer on the card of ``message`` (ignored when it no longer waits)."""
        for asked, future in self._questions:
            if asked is message and not future.done():
                future.set_result(choice)

    async def run(
        self, hub: ToolHub, conversation: Conversation, calls: list[ToolCall], tools: dict[str, ToolSpec]
    ) -> None:
        """Answer each of ``calls`` in turn; ``tools`` are the ones offered, by the name the model calls."""
        for call in calls:
            tool = tools.get(call.name)
            message = self._add(conversation, call, tool)
            status, text, seconds = await self._outcome(hub, conversation, message, call, tool)
            self._settle(conversation, message, status, text, seconds)

    def stop(self, conversation: Conversation, calls: list[ToolCall]) -> None:
        """After ``run`` was cancelled: answer the call in progress, and those not reached, as stopped."""
        cards = {message.tool.call_id: message for message in conversation.messages if message.tool is not None}
        for call in calls:
            message = cards.get(call.id) or self._add(conversation, call, None)
            if message.tool is not None and message.tool.pending:
                self._settle(conversation, message, "stopped", STOPPED)

    def skip(self, conversation: Conversation, calls: list[ToolCall], limit: int) -> None:
        """Answer each of ``calls`` with a note that it was not run."""
        for call in calls:
            self._settle(conversation, self._add(conversation, call, None), "skipped", skipped_text(limit))

    async def _outcome(
        self, hub: ToolHub, conversation: Conversation, message: DisplayMessage, call: ToolCall, tool: ToolSpec | None
    ) -> tuple[ToolStatus, str, float]:
        """How the call ends: its status, the text the model reads, and the seconds it took."""
        if tool is None:
            return "error", f"There is no tool named “{call.name}”. Call one of the tools offered.", 0.0
        arguments = _arguments(call.arguments)
        if arguments is None:
            return "error", f"The arguments of {call.name} must be a JSON object; got: {call.arguments}", 0.0
        if not hub.always_allowed(tool):
            choice = await self._ask(message)
            if choice == "deny":
                return "denied", DENIED, 0.0
            if choice == "allow_always":
                hub.allow_always(tool)
        self._settle(conversation, message, "running", "")
        try:
            outcome = await hub.call(tool, arguments, TOOL_TIMEOUT_S)
        except Exception as error:  # the hub answers with outcomes; one that raises anyway must not hang the reply
            return "error", f"The tool could not be called: {error}", 0.0
        return outcome.status, outcome.text, outcome.seconds

    async def _ask(self, message: DisplayMessage) -> ToolAnswer:
        question = (message, asyncio.get_running_loop().create_future())
        self._questions.append(question)
        try:
            return await question[1]
        finally:
            self._questions.remove(question)

    def _add(self, conversation: Conversation, call: ToolCall, tool: ToolSpec | None) -> DisplayMessage:
        """A card for ``call``, waiting; kept on screen (with a notice) even when it could not be saved."""
        turn = ToolTurn(call.id, call.name, call.arguments, server=tool.server if tool is not None else "")
        try:
            message = self._journal.add_tool_turn(conversation, turn)
        except StorageError as error:
            self.notice.emit(str(error))
            message = conversation.add_tool_turn(turn)
        self.turn_added.emit(conversation, message)
        return message

    def _settle(
        self, conversation: Conversation, message: DisplayMessage, status: ToolStatus, text: str, seconds: float = 0.0
    ) -> None:
        """Show and save the call's new ``status`` and ``text``."""
        assert message.tool is not None
        message.tool = dataclasses.replace(message.tool, status=status, seconds=seconds)
        message.content = text
        if message.message_id:
            try:
                self._journal.save_tool_turn(message)
            except StorageError as error:
                self.notice.emit(str(error))
        self.turn_changed.emit(conversation, message)


def _arguments(text: str) -> dict | None:
    """The arguments object of a call's JSON text; None when it is not a JSON object."""
    try:
        arguments = json.loads(text or "{}")
    except ValueError:
        return None
    return arguments if isinstance(arguments, dict) else None
