"""EngineController: requests reach the engine, every event kind comes back as its own signal."""

from __future__ import annotations

import typing

import pytest

from app.controller import SIGNAL_FOR_EVENT, EngineController
from engine.protocol.messages import ChatMessage, Event, Generate, ModelLoaded, ReplyFinished, TokenStreamed


def test_every_event_kind_has_a_signal():
    assert set(SIGNAL_FOR_EVENT) == set(typing.get_args(Event))
    for name in SIGNAL_FOR_EVENT.values():
        assert hasattr(EngineController, name)


@pytest.fixture
def controller(qasync_loop, fake_engine_factory):
    engine_controller = EngineController()
    engine_controller.start(fake_engine_factory())
    yield engine_controller
    engine_controller.close()


def test_load_model_answers_with_model_loaded_for_that_request(qtbot, controller):
    with qtbot.waitSignal(controller.model_loaded, timeout=5000) as loaded:
        request_id = controller.load_model("fake-model")

    event = loaded.args[0]
    assert isinstance(event, ModelLoaded)
    assert (event.request_id, event.path) == (request_id, "fake-model")


def test_send_prompt_streams_tokens_then_finishes(qtbot, controller, script):
    history = (ChatMessage("user", "Hi"),)
    tokens: list[TokenStreamed] = []
    controller.token_streamed.connect(tokens.append)
    with qtbot.waitSignal(controller.reply_finished, timeout=5000) as finished:
        request_id = controller.send_prompt("conversation-1", history)

    assert script.generates == [Generate(request_id, "conversation-1", history)]
    assert "".join(token.text for token in tokens) == script.full_reply
    assert isinstance(finished.args[0], ReplyFinished)
    assert finished.args[0].request_id == request_id


def test_stop_cancels_the_reply(qtbot, controller, script):
    script.reply_tokens = ("x",) * 1000
    script.token_delay_s = 0.01
    with qtbot.waitSignal(controller.token_streamed, timeout=5000):
        request_id = controller.send_prompt("conversation-1", (ChatMessage("user", "Hi"),))
    with qtbot.waitSignal(controller.reply_finished, timeout=5000) as finished:
        controller.stop(request_id)

    assert finished.args[0].stats.finish_reason == "cancelled"
    assert len(finished.args[0].text) < 1000


def test_requests_before_start_are_refused_clearly(qasync_loop):
    with pytest.raises(RuntimeError, match="not started"):
        EngineController().load_model("fake-model")
