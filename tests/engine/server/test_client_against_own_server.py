"""Hearth's remote client against Hearth's own server (issue #15): the remote runtime on its ``AsyncEngine``, as the
app's controller runs it, talking over 127.0.0.1 to the API server whose engine thread holds the tiny model
(test thread's asyncio loop + remote engine thread + server thread + server's engine thread)."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from engine.api.server.config import ServerConfig
from engine.api.remote.runtime import RemoteRuntime
from engine.protocol.messages import (
    Cancel,
    ChatMessage,
    Event,
    Generate,
    ListRemoteModels,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    RemoteModelsFailed,
    RemoteModelsListed,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    SamplingParams,
    TokenStreamed,
)
from engine.service.client import AsyncEngine

if TYPE_CHECKING:
    from tests.engine.server.conftest import Served

T = TypeVar("T")

WAIT_S = 60.0
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
LONG = SamplingParams(temperature=0.0, max_new_tokens=1000)
FIRST_TURN = (ChatMessage("system", "Be brief."), ChatMessage("user", "What is the capital of France?"))


class RemoteApp:
    """The remote engine the way the app's controller holds it: an ``AsyncEngine`` running ``RemoteRuntime``."""

    def __init__(self) -> None:
        self.engine = AsyncEngine(RemoteRuntime)

    async def until(self, *kinds: type, timeout: float = WAIT_S) -> tuple[Event, list[Event]]:
        """The first event of one of ``kinds``, and every event before it."""
        seen: list[Event] = []
        async with asyncio.timeout(timeout):
            while not isinstance(event := await self.engine.next_event(), kinds):
                seen.append(event)
        return event, seen

    async def connect(self, server: RemoteServer, model: str) -> Event:
        self.engine.submit(LoadModel(uuid.uuid4().hex, model, server=server))
        return (await self.until(ModelLoaded, LoadFailed))[0]

    async def ask(self, messages: tuple[ChatMessage, ...], sampling: SamplingParams = GREEDY) -> tuple[Event, list[Event]]:
        self.engine.submit(Generate(uuid.uuid4().hex, "chat-1", messages, sampling))
        return await self.until(ReplyFinished, ReplyFailed)


def with_remote_app(scenario: Callable[[RemoteApp], Awaitable[T]]) -> T:
    """Run ``await scenario(app)`` on a fresh asyncio loop, closing the remote engine afterwards."""
    async def main() -> T:
        app = RemoteApp()
        try:
            return await scenario(app)
        finally:
            app.engine.close(5)
    return asyncio.run(main())


def engine_reply(served: Served, messages: tuple[ChatMessage, ...]) -> ReplyFinished:
    """What the server's own engine answers ``messages`` with, asked directly through its hub."""
    events: queue.Queue[Event] = queue.Queue()
    request_id = uuid.uuid4().hex
    served.hub.submit(Generate(request_id, f"reference-{request_id}", messages, GREEDY, "stop"), events.put)
    while not isinstance(event := events.get(timeout=WAIT_S), (ReplyFinished, ReplyFailed)):
        pass
    assert isinstance(event, ReplyFinished), event
    return event


def test_the_models_are_listed_and_one_is_loaded(served_tiny: Served) -> None:
    served_context = engine_reply(served_tiny, FIRST_TURN).stats.context_length

    async def scenario(app: RemoteApp):
        app.engine.submit(ListRemoteModels("list-1", RemoteServer(served_tiny.url)))
        listed = (await app.until(RemoteModelsListed, RemoteModelsFailed))[0]
        return listed, await app.connect(RemoteServer(served_tiny.url), served_tiny.model_id)

    listed, loaded = with_remote_app(scenario)

    assert isinstance(listed, RemoteModelsListed), listed
    assert (listed.base_url, listed.models) == (served_tiny.root, (served_tiny.model_id,))
    assert isinstance(loaded, ModelLoaded), loaded
    assert (loaded.name, loaded.server, loaded.precision) == (served_tiny.model_id, served_tiny.root, "remote")
    assert loaded.context_length == served_context > 0  # the app's context bar knows the server's window


def test_a_streamed_reply_matches_the_engine_and_brings_the_servers_figures(served_tiny: Served) -> None:
    expected = engine_reply(served_tiny, FIRST_TURN)

    async def scenario(app: RemoteApp):
        await app.connect(RemoteServer(served_tiny.url), served_tiny.model_id)
        first = await app.ask(FIRST_TURN)
        second_turn = (*FIRST_TURN, ChatMessage("assistant", first[0].text), ChatMessage("user", "And of Italy?"))
        return first, await app.ask(second_turn)

    (first, streamed), (second, _) = with_remote_app(scenario)

    assert isinstance(first, ReplyFinished) and isinstance(second, ReplyFinished), (first, second)
    assert first.text == expected.text and first.text
    assert "".join(e.text for e in streamed if isinstance(e, TokenStreamed)) == first.text
    figures = first.stats.remote
    assert (figures.server, figures.model) == (served_tiny.root, served_tiny.model_id)
    assert figures.prompt_tokens == expected.stats.prompt_tokens == first.stats.prompt_tokens
    assert figures.completion_tokens == expected.stats.tokens_generated == first.stats.tokens_generated
    again = second.stats.remote
    assert again.prompt_tokens > figures.prompt_tokens + figures.completion_tokens
    assert again.cached_tokens == second.stats.reused_tokens
    assert again.cached_tokens >= figures.prompt_tokens  # the first turn's prompt was not computed again
    assert again.completion_tokens == second.stats.tokens_generated > 0


def test_cancel_mid_reply_reaches_the_server_and_the_next_reply_works(served_tiny: Served) -> None:
    async def scenario(app: RemoteApp):
        await app.connect(RemoteServer(served_tiny.url), served_tiny.model_id)
        served_tiny.hub.forget_submitted()
        app.engine.submit(Generate("long-1", "chat-1", FIRST_TURN, LONG))
        for _ in range(3):
            await app.until(TokenStreamed)
        app.engine.submit(Cancel("long-1"))
        cancelled = (await app.until(ReplyFinished, ReplyFailed, timeout=5))[0]
        generate_id, cancel_id = await asyncio.to_thread(served_tiny.hub.wait_for_cancel)
        return cancelled, generate_id, cancel_id, (await app.ask(FIRST_TURN))[0]

    cancelled, generate_id, cancel_id, after = with_remote_app(scenario)

    assert isinstance(cancelled, ReplyFinished) and cancelled.stats.finish_reason == "cancelled"
    assert cancelled.text and cancelled.stats.tokens_generated < LONG.max_new_tokens
    assert cancel_id == generate_id  # the server saw the client leave and stopped its engine
    assert isinstance(after, ReplyFinished) and after.text == engine_reply(served_tiny, FIRST_TURN).text


def test_a_wrong_api_key_is_named(served_tiny: Served) -> None:
    keyed = served_tiny.start_another(ServerConfig(port=0, api_key="sk-right"))
    try:
        failed = with_remote_app(lambda app: app.connect(RemoteServer(keyed.url, "sk-wrong"), served_tiny.model_id))
        loaded = with_remote_app(lambda app: app.connect(RemoteServer(keyed.url, "sk-right"), served_tiny.model_id))
    finally:
        keyed.stop()

    assert isinstance(failed, LoadFailed)
    assert failed.message.startswith(f"The server at {keyed.url.removesuffix('/v1')} refused the API key (HTTP 401: ")
    assert "The API key is wrong." in failed.message and "sk-" not in failed.message
    assert isinstance(loaded, ModelLoaded)


def test_an_unknown_model_is_named_with_the_one_served(served_tiny: Served) -> None:
    failed = with_remote_app(lambda app: app.connect(RemoteServer(served_tiny.url), "gpt-4o"))

    assert isinstance(failed, LoadFailed)
    assert failed.message == (
        f'The server at {served_tiny.root} does not run a model called "gpt-4o"; it lists {served_tiny.model_id}.'
    )

