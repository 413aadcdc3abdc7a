"""The window as ``app.main`` runs it (qasync's loop and policy): what only shows under the real event loop."""

from __future__ import annotations

import asyncio
import http.client
import math
import time

import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.perf.format import format_bytes, format_count, format_ms, format_tok_s
from app.window.server_menu import ServerSettingsDialog
from engine.protocol.messages import ReplyFinished
from engine.service.client import AsyncEngine

from tests.app.conftest import RealApp

BUILT_IN_LOAD_S = 300.0
GUI_STALL_LIMIT_S = 0.5


def _serve_on_a_free_port(window) -> None:
    window.server_menu.settings_action.trigger()
    dialog = window.findChild(ServerSettingsDialog)
    dialog.port.setValue(0)
    dialog.accept()
    dialog.deleteLater()


def _ask_first_model(url: str) -> str:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0.0,
    )
    return reply.choices[0].message.content


def _port_refuses(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
    except ConnectionRefusedError:
        return True
    finally:
        connection.close()
    return False


def test_server_menu_serves_the_built_in_model_to_the_openai_client_and_stops(qapp, default_model_path):
    app = RealApp(AsyncEngine)

    async def scenario(window) -> None:
        await app.until(window.input_bar.send_button.isEnabled, timeout_s=BUILT_IN_LOAD_S)
        menu = window.server_menu
        assert not menu.url_action.isEnabled(), "nothing to copy before a server runs"
        _serve_on_a_free_port(window)
        started_at = time.monotonic()
        menu.start_action.trigger()
        assert time.monotonic() - started_at < GUI_STALL_LIMIT_S, "the window must not wait for the server"
        await app.until(lambda: menu.serving)
        assert menu.url_action.isEnabled() and not menu.start_action.isEnabled()

        answer = await asyncio.get_running_loop().run_in_executor(None, _ask_first_model, menu.url)
        assert answer.strip()

        port = menu.server.config.port
        menu.stop_action.trigger()
        assert _port_refuses(port)
        assert menu.start_action.isEnabled() and not menu.url_action.isEnabled()

    app.run(scenario, str(default_model_path), timeout_s=BUILT_IN_LOAD_S + 120)


def _type_and_send(window, text: str) -> None:
    prompt = window.input_bar.prompt
    QTest.keyClicks(prompt, text)
    QTest.keyClick(prompt, Qt.Key.Key_Return)


def test_a_model_loads_while_a_reply_streams_and_another_chat_goes_on(real_app, script):
    script.interleave = True
    script.token_delay_s = 0.03
    script.load_delay_s = 0.5
    script.reply_tokens = tuple(f" word{index}" for index in range(30))

    async def scenario(window) -> None:
        session = window.session
        await real_app.until(window.input_bar.send_button.isEnabled)
        _type_and_send(window, "First")
        await real_app.until(lambda: session.generating)
        first = session.conversation

        window.model_loader.load("/models/second.gguf")
        window.conversations.new_conversation()
        await real_app.until(lambda: session.conversation is not first)
        assert window.input_bar.send_button.isEnabled(), "the loaded model answers while the next one loads"
        _type_and_send(window, "Second")
        assert window.input_bar.prompt.toPlainText() == "", "the message was sent, not refused"

        await real_app.until(lambda: len(script.loads) == 2 and not session.replies.reply_in(first.id)
                             and not session.generating, timeout_s=20)
        assert [message.content for message in (first.messages[-1], session.conversation.messages[-1])] == [
            script.full_reply, script.full_reply,
        ]
        await real_app.until(lambda: "second.gguf" in window.status_line.state_label.text())

    real_app.run(scenario)


def test_tab_leaves_the_message_box_for_send_and_stop(real_app):
    async def scenario(window) -> None:
        await real_app.until(window.input_bar.send_button.isEnabled)
        window.activateWindow()
        prompt = window.input_bar.prompt
        prompt.setFocus()
        await real_app.until(prompt.hasFocus)
        QTest.keyClicks(prompt, "Hi")
        QTest.keyClick(prompt, Qt.Key.Key_Tab)

        assert prompt.toPlainText() == "Hi"
        assert QApplication.focusWidget() is window.input_bar.send_button
        QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab, Qt.KeyboardModifier.ShiftModifier)
        assert QApplication.focusWidget() is prompt

    real_app.run(scenario)


def test_the_panel_figures_during_and_after_a_reply_agree_with_its_events(real_app, script):
    script.interleave = True  # the fake then reports BatchSampled like the batching engine
    script.token_delay_s = 0.03
    script.reply_tokens = tuple(f" w{index}" for index in range(40))

    async def scenario(window) -> None:
        window.performance_dock.show()
        panel = window.performance_dock.panel
        await real_app.until(window.input_bar.send_button.isEnabled)
        _type_and_send(window, "Hi")
        await real_app.until(lambda: panel.state.reply is not None and panel.state.reply.tokens_generated >= 10)
        panel.refresh()

        assert panel.value_text("ttft") != "—", "the first token came: its time is known"
        assert panel.value_text("decode_speed") == panel.value_text("batch_throughput"), "one reply: one rate"
        prompt_and_reply = panel.state.reply.context_in_use
        assert panel.value_text("kv_conversation") == format_bytes(math.ceil(prompt_and_reply / 16) * 256 * 1024)

        await real_app.until(lambda: not window.session.generating)
        finished = next(event for event in script.emitted if isinstance(event, ReplyFinished))
        panel.refresh()
        assert panel.value_text("ttft") == format_ms(finished.stats.ttft_ms)
        assert panel.value_text("decode_speed") == format_tok_s(finished.stats.decode_tok_s)
        assert panel.value_text("tokens_generated") == format_count(finished.stats.tokens_generated)

    real_app.run(scenario)
