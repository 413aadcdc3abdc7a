"""File › Connect to server…: pick a model on a remote OpenAI-compatible server and chat with it in the window.

The local model is the scripted fake; the remote one is a fake OpenAI-compatible
server on 127.0.0.1 answered by the real remote runtime on its own engine thread.
"""

from __future__ import annotations

import stat

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from app.models.remote_dialog import RemoteServerDialog
from app.storage import ChatStore, export_json, export_markdown
from app.storage.settings import default_settings_path, load_settings
from tests.openai_fake import FakeOpenAIServer, FakeScript

API_KEY = "sk-remote-5ecret-key"
QUESTION = "What is the capital of France?"


@pytest.fixture
def remote_script() -> FakeScript:
    return FakeScript(api_key=API_KEY, piece_delay_s=0.01)


@pytest.fixture
def remote_server(remote_script):
    server = FakeOpenAIServer(remote_script)
    yield server
    server.close()


def _file_menu_action(window, text: str):
    menu = next(action.menu() for action in window.menuBar().actions() if action.text() == "&File")
    return next(action for action in menu.actions() if action.text() == text)


def _open_dialog(qtbot, window) -> RemoteServerDialog:
    _file_menu_action(window, "Connect to &server…").trigger()
    qtbot.waitUntil(lambda: any(d.isVisible() for d in window.findChildren(RemoteServerDialog)), timeout=5000)
    return next(d for d in window.findChildren(RemoteServerDialog) if d.isVisible())


def _connect(qtbot, chat, window, base_url: str, key: str = API_KEY, model: str = "big-model") -> None:
    """Type the address and key, list the models, pick ``model`` and wait until it is in use."""
    chat.wait_until_ready()
    dialog = _open_dialog(qtbot, window)
    dialog.address.setCurrentText(base_url)
    dialog.api_key.setText(key)
    qtbot.mouseClick(dialog.list_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.models.count() > 0, timeout=5000)
    dialog.models.setCurrentItem(dialog.models.findItems(model, Qt.MatchFlag.MatchExactly)[0])
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.status_line.state_label.text().startswith(f"Ready: {model} on 127.0.0.1"), timeout=5000)
    chat.wait_until_ready()


def test_chat_with_a_remote_model_then_the_connection_is_cut(qtbot, chat, window, script, remote_server, remote_script):
    _connect(qtbot, chat, window, remote_server.base_url)
    assert "(remote)" in window.status_line.state_label.text()  # ", loaded in 0.0 s" may still follow it

    chat.send_and_wait(QUESTION)

    assert chat.last_reply().content == "The capital is Paris." and chat.last_reply().state == "done"
    assert "the server says 64.2 tokens/s, 16 of 21 prompt tokens cached" in window.status_line.stats_label.text()
    assert script.generates == []  # the local fake engine was not asked
    panel = window.performance_dock.panel
    panel.refresh()
    assert panel.remote_box.isVisibleTo(panel)
    assert panel.remote_box.values["remote_decode_speed"].text() == "64.2 tok/s"
    assert panel.remote_box.values["remote_cached_tokens"].text() == "16 tokens"
    remote_script.failure = "cut"
    chat.send_and_wait("And of Italy?")

    reply = chat.last_reply()
    assert (reply.state, reply.content) == ("error", "The capital")
    assert "broke off in the middle of the reply" in reply.error
    assert chat.shown_texts()[-1].startswith("The capital")
    assert "The reply failed: The connection to" in window.status_line.currentMessage()
    remote_script.failure = ""
    window.session.regenerate(reply)
    chat.wait_until_reply_ends()
    assert (chat.last_reply().content, chat.last_reply().state) == ("The capital is Paris.", "done")


def test_stop_ends_a_remote_reply_and_keeps_what_arrived(qtbot, chat, window, remote_server, remote_script):
    _connect(qtbot, chat, window, remote_server.base_url)
    remote_script.failure = "endless"
    chat.type_and_press_enter(QUESTION)
    qtbot.waitUntil(lambda: chat.last_reply().content.count("more") >= 3, timeout=5000)

    qtbot.mouseClick(window.input_bar.stop_button, Qt.MouseButton.LeftButton)
    chat.wait_until_reply_ends()

    assert chat.last_reply().state == "interrupted"
    assert chat.last_reply().content.startswith(" more more more")
    assert remote_script.client_left.wait(3)


def test_the_key_stays_in_the_private_settings_file(qtbot, chat, window, remote_server, hearth_home):
    _connect(qtbot, chat, window, remote_server.base_url + "/v1")
    chat.send_and_wait(QUESTION)
    window.close()

    saved = load_settings().settings.remote_servers
    assert [(c.base_url, c.api_key, c.model) for c in saved] == [(remote_server.base_url, API_KEY, "big-model")]
    assert stat.S_IMODE(default_settings_path().stat().st_mode) == 0o600
    store = ChatStore.open()
    conversation = store.load_conversation(store.list_conversations()[0].id)
    assert conversation.messages[-1].stats["remote"]["server"] == remote_server.base_url
    assert API_KEY not in export_json(conversation) + export_markdown(conversation)
    store.close()
    for path in hearth_home.rglob("*"):
        if path.is_file() and path != default_settings_path():
            assert API_KEY.encode() not in path.read_bytes(), path


def test_a_remembered_server_survives_a_setting_changed_afterwards(qtbot, chat, window, remote_server, reopen):
    _connect(qtbot, chat, window, remote_server.base_url + "/v1")
    dark = next(a for a in window.theme_switcher.group.actions() if a.data() == "dark")
    dark.trigger()

    reopened = reopen()

    saved = reopened.settings_holder.settings.remote_servers
    assert [(c.base_url, c.api_key, c.model) for c in saved] == [(remote_server.base_url, API_KEY, "big-model")]
    assert reopened.settings_holder.settings.theme == "dark"


def test_a_saved_connection_fills_the_dialog_and_a_wrong_key_is_explained(qtbot, chat, window, remote_server):
    _connect(qtbot, chat, window, remote_server.base_url)
    dialog = _open_dialog(qtbot, window)
    assert (dialog.address.currentText(), dialog.api_key.text()) == (remote_server.base_url, API_KEY)

    dialog.api_key.setText("sk-wrong")
    qtbot.keyClick(dialog.api_key, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "refused the API key" in dialog.message.text(), timeout=5000)

    assert dialog.models.count() == 0
    assert not dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    dialog.address.setCurrentText("gopher://old")
    qtbot.mouseClick(dialog.list_button, Qt.MouseButton.LeftButton)
    assert dialog.message.text() == "The address must start with http:// or https://, not gopher://."


def test_loading_a_local_model_again_routes_replies_back_to_it(qtbot, chat, window, script, remote_server):
    _connect(qtbot, chat, window, remote_server.base_url)
    chat.send_and_wait(QUESTION)

    window.session.load_model("fake-model")
    qtbot.waitUntil(lambda: window.status_line.state_label.text().startswith("Ready: Fake model"), timeout=5000)
    chat.send_and_wait("Hello?")

    assert chat.last_reply().content == script.full_reply
    assert len(script.generates) == 1
    window.performance_dock.panel.refresh()
    assert not window.performance_dock.panel.remote_box.isVisibleTo(window.performance_dock.panel)


def test_a_server_that_went_away_is_named_and_the_window_keeps_working(qtbot, chat, window, remote_server):
    _connect(qtbot, chat, window, remote_server.base_url)
    remote_server.close()

    chat.send_and_wait(QUESTION)

    reply = chat.last_reply()
    assert reply.state == "error"
    assert reply.error.startswith(f"Could not reach the server at {remote_server.base_url}: the connection was refused.")
    chat.wait_until_ready()
    assert window.input_bar.send_button.isEnabled()


def test_the_servers_words_are_shown_as_plain_text(qtbot, chat, window, remote_server, remote_script):
    remote_script.refusal = '<a href="http://evil.example/">Click <b>here</b></a>'
    chat.wait_until_ready()
    dialog = _open_dialog(qtbot, window)
    dialog.address.setCurrentText(remote_server.base_url)
    dialog.api_key.setText("sk-wrong")

    qtbot.mouseClick(dialog.list_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "refused the API key" in dialog.message.text(), timeout=5000)

    assert dialog.message.textFormat() == Qt.TextFormat.PlainText
    assert '<a href="http://evil.example/">Click <b>here</b></a>' in dialog.message.text()
    dialog.reject()
