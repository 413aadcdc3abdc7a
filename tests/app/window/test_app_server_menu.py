"""The Server menu runs the API server on the window's own engine thread; its requests show in the panel."""

from __future__ import annotations

import http.client
import stat
from concurrent.futures import ThreadPoolExecutor

import openai
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMessageBox

from app.storage.settings import default_settings_path
from app.window.server_menu import ServerSettingsDialog

LOCAL_KEY = "sk-hearth-local-5ecret"


def _settings_dialog(window, port: int, key: str = "", everywhere: bool = False) -> None:
    window.server_menu.settings_action.trigger()
    dialog = window.findChild(ServerSettingsDialog)
    dialog.port.setValue(port)
    dialog.api_key.setText(key)
    dialog.everywhere.setChecked(everywhere)
    dialog.accept()
    dialog.deleteLater()


def _ask(url: str, key: str = "unused") -> str:
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="Fake model", messages=[{"role": "user", "content": "Hi"}])
    return reply.choices[0].message.content


def test_the_server_answers_through_the_window_engine_and_shows_in_the_panel(chat, script, window, qtbot):
    chat.wait_until_ready()
    _settings_dialog(window, port=0)
    window.server_menu.start_action.trigger()
    menu = window.server_menu
    assert menu.server is not None and not menu.start_action.isEnabled()
    bubbles_before = len(window.chat_view.bubbles)

    with ThreadPoolExecutor(max_workers=1) as pool:
        reply = pool.submit(_ask, menu.url)
        qtbot.waitUntil(reply.done, timeout=10000)
    requests = menu.requests
    qtbot.waitUntil(lambda: bool(requests.rows()) and requests.rows()[0].state == "done", timeout=5000)

    assert reply.result() == script.full_reply
    assert script.generates[-1].conversation_id.startswith("api-")
    assert len(window.chat_view.bubbles) == bubbles_before  # the server's reply never reaches the chat view
    line = requests.label.text()
    assert "127.0.0.1" in line and "OpenAI" in line and "chat/completions" in line and "done" in line
    assert str(menu.server.config.port) in menu.url_action.text()
    menu.url_action.trigger()
    assert QGuiApplication.clipboard().text() == menu.url


def test_the_panel_says_how_far_a_long_api_prompt_is_read(chat, script, window, qtbot):
    script.reading = ((5_600, 16_000), (12_000, 16_000))
    script.reading_delay_s = 0.6  # PromptProgress is paced at most twice a second
    chat.wait_until_ready()
    _settings_dialog(window, port=0)
    window.server_menu.start_action.trigger()
    requests = window.server_menu.requests

    with ThreadPoolExecutor(max_workers=1) as pool:
        reply = pool.submit(_ask, window.server_menu.url)
        qtbot.waitUntil(lambda: "reading the conversation… 35 % of 16,000 tokens" in requests.label.text(),
                        timeout=5000)
        qtbot.waitUntil(lambda: "75 % of 16,000 tokens" in requests.label.text(), timeout=5000)
        qtbot.waitUntil(reply.done, timeout=10000)

    qtbot.waitUntil(lambda: requests.rows()[0].state == "done", timeout=5000)
    assert "reading" not in requests.label.text()


def test_stopping_the_server_closes_its_port(chat, window, qtbot):
    chat.wait_until_ready()
    _settings_dialog(window, port=0)
    window.server_menu.start_action.trigger()
    port = window.server_menu.server.config.port
    window.server_menu.stop_action.trigger()

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert refused
    assert window.server_menu.server is None and window.server_menu.start_action.isEnabled()


def test_other_machines_without_a_key_are_refused_with_a_message(chat, window, qtbot):
    chat.wait_until_ready()
    _settings_dialog(window, port=0, everywhere=True)

    qtbot.waitUntil(lambda: any(box.isVisible() for box in window.findChildren(QMessageBox)), timeout=5000)
    box = next(box for box in window.findChildren(QMessageBox) if box.isVisible())
    assert "API key" in box.text()
    assert window.server_menu.config.host == "127.0.0.1"


def test_a_chat_in_the_window_and_an_api_request_share_the_engine(chat, script, window, qtbot):
    script.token_delay_s = 0.02
    chat.wait_until_ready()
    _settings_dialog(window, port=0)
    window.server_menu.start_action.trigger()

    with ThreadPoolExecutor(max_workers=1) as pool:
        reply = pool.submit(_ask, window.server_menu.url)
        chat.type_and_press_enter("Hi from the window")
        chat.wait_until_reply_ends()
        qtbot.waitUntil(reply.done, timeout=10000)

    assert reply.result() == script.full_reply
    assert chat.last_reply().content == script.full_reply
    assert chat.last_reply().state != "error"
    assert {generate.conversation_id.startswith("api-") for generate in script.generates} == {True, False}


def test_the_port_address_and_key_come_back_after_a_restart_and_the_key_stays_private(chat, window, reopen, hearth_home):
    chat.wait_until_ready()
    _settings_dialog(window, port=8123, key=LOCAL_KEY, everywhere=True)
    chat.send_and_wait("Hi")  # a conversation in the database, to look for the key in
    window.close()

    reopened = reopen().server_menu

    assert (reopened.config.port, reopened.config.api_key, reopened.config.host) == (8123, LOCAL_KEY, "0.0.0.0")
    assert reopened.server is None, "the server starts only when asked"
    assert "8123" in reopened.url_action.text()
    _settings_dialog(reopened.parent(), port=8124, key=LOCAL_KEY)
    assert reopen().server_menu.config.host == "127.0.0.1", "unticking 'other machines' is kept too"
    assert stat.S_IMODE(default_settings_path().stat().st_mode) == 0o600
    for path in hearth_home.rglob("*"):
        if path.is_file() and path != default_settings_path():
            assert LOCAL_KEY.encode() not in path.read_bytes(), path


def test_a_server_that_fails_to_start_says_why_and_frees_its_port(chat, window, qtbot, monkeypatch):
    import uvicorn

    async def broken_serve(self, sockets=None):
        raise RuntimeError("no event loop for you")

    monkeypatch.setattr(uvicorn.Server, "serve", broken_serve)
    chat.wait_until_ready()
    _settings_dialog(window, port=0)
    menu = window.server_menu
    menu.start_action.trigger()
    port = menu.server.config.port

    qtbot.waitUntil(lambda: any(box.isVisible() for box in window.findChildren(QMessageBox)), timeout=5000)
    box = next(box for box in window.findChildren(QMessageBox) if box.isVisible())
    assert "no event loop for you" in box.text()
    assert menu.server is None and menu.start_action.isEnabled() and not menu.url_action.isEnabled()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert refused, "the port is free again"
