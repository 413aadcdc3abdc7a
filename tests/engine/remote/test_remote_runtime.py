"""The remote runtime on a real engine thread against a fake OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from engine.protocol.messages import (
    Cancel,
    Generate,
    ListRemoteModels,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    PrefillDone,
    RemoteModelsFailed,
    RemoteModelsListed,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    StatusChanged,
    TokenStreamed,
)
from tests.openai_fake import QUESTION, FakeOpenAIServer, FakeScript, RemoteDriver, free_port


@pytest.fixture
def fake_script() -> FakeScript:
    return FakeScript()


@pytest.fixture
def fake_server(fake_script):
    server = FakeOpenAIServer(fake_script)
    yield server
    server.close()


@pytest.fixture
def driver():
    remote = RemoteDriver()
    yield remote
    remote.thread.stop(5)


def test_a_reply_streams_and_the_servers_figures_reach_the_stats(driver, fake_server, fake_script):
    loaded = driver.connect(RemoteServer(fake_server.base_url + "/v1/"))

    finished, before = driver.ask()

    assert isinstance(loaded, ModelLoaded)
    assert (loaded.name, loaded.server, loaded.precision, loaded.context_length) == ("big-model", fake_server.base_url, "remote", 8192)
    assert [e.text for e in before if isinstance(e, TokenStreamed)] == list(fake_script.pieces)
    assert isinstance(finished, ReplyFinished) and finished.text == "The capital is Paris."
    prefill = next(e for e in before if isinstance(e, PrefillDone))
    stats = finished.stats
    assert stats.ttft_ms == pytest.approx(prefill.prefill_ms) and stats.ttft_ms > 0
    assert (stats.prompt_tokens, stats.tokens_generated, stats.reused_tokens, stats.finish_reason) == (21, 5, 16, "eos")
    remote = stats.remote
    assert (remote.server, remote.model, remote.cached_tokens, remote.cache_n) == (fake_server.base_url, "big-model", 16, 16)
    assert (remote.prompt_tok_s, remote.decode_tok_s, remote.completion_tokens) == (812.5, 64.25, 5)
    sent = fake_script.bodies[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("big-model", 0.0, 64)


def test_the_models_are_listed_and_the_key_is_sent_as_a_bearer_token(driver, fake_server, fake_script):
    fake_script.api_key = "sk-secret"
    driver.thread.submit(ListRemoteModels("list-1", RemoteServer(fake_server.base_url.removeprefix("http://"), "sk-secret")))

    listed, _ = driver.wait_for(RemoteModelsListed, RemoteModelsFailed)

    assert isinstance(listed, RemoteModelsListed)
    assert (listed.base_url, listed.models) == (fake_server.base_url, ("big-model", "other-model"))
    assert fake_script.auth_headers == ["Bearer sk-secret"]
    assert "sk-secret" not in repr(RemoteServer(fake_server.base_url, "sk-secret"))


def test_cancel_closes_the_stream_and_keeps_the_text(driver, fake_server, fake_script):
    fake_script.failure = "endless"
    driver.connect(RemoteServer(fake_server.base_url))
    driver.thread.submit(Generate("reply-1", "chat-1", QUESTION))
    for _ in range(3):
        driver.wait_for(TokenStreamed)

    driver.thread.submit(Cancel("reply-1"))
    finished, _ = driver.wait_for(ReplyFinished, ReplyFailed, timeout=2)

    assert isinstance(finished, ReplyFinished) and finished.stats.finish_reason == "cancelled"
    assert finished.text.startswith(" more more more")
    assert fake_script.client_left.wait(3), "the server kept streaming to a cancelled client"


def test_cancel_while_the_server_is_still_silent(driver, fake_server, fake_script):
    fake_script.failure = "silent"
    driver.connect(RemoteServer(fake_server.base_url))
    driver.thread.submit(Generate("reply-1", "chat-1", QUESTION))
    while driver.wait_for(StatusChanged)[0].state != "generating":
        pass
    deadline = time.monotonic() + 5
    while not fake_script.bodies and time.monotonic() < deadline:
        time.sleep(0.01)  # the request reached the server, which now says nothing for seconds

    driver.thread.submit(Cancel("reply-1"))
    finished, seen = driver.wait_for(ReplyFinished, ReplyFailed, timeout=1)

    assert isinstance(finished, ReplyFinished) and finished.stats.finish_reason == "cancelled"
    assert finished.text == "" and not [e for e in seen if isinstance(e, TokenStreamed)]


def test_a_connection_cancelled_while_the_server_is_asked_changes_nothing(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url), "other-model")
    fake_script.list_delay_s = 0.3
    driver.thread.submit(LoadModel("load-2", "big-model", server=RemoteServer(fake_server.base_url)))
    driver.thread.submit(Cancel("load-2"))

    failed, _ = driver.wait_for(ModelLoaded, LoadFailed)
    finished, _ = driver.ask()

    assert isinstance(failed, LoadFailed) and failed.message == "Connecting was cancelled; the model in use stays."
    assert isinstance(finished, ReplyFinished) and fake_script.bodies[-1]["model"] == "other-model"


def test_an_unreachable_server_is_named(driver):
    address = f"http://127.0.0.1:{free_port()}"

    failed = driver.connect(RemoteServer(address))

    assert isinstance(failed, LoadFailed)
    assert failed.message.startswith(f"Could not reach the server at {address}: the connection was refused.")


def test_a_wrong_key_says_so(driver, fake_server, fake_script):
    fake_script.api_key = "sk-right"

    failed = driver.connect(RemoteServer(fake_server.base_url, "sk-wrong"))

    assert isinstance(failed, LoadFailed)
    assert "refused the API key (HTTP 401: Invalid API key)" in failed.message


def test_a_model_the_server_no_longer_has(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url))
    fake_script.models = ("other-model",)

    failed, _ = driver.ask()
    refused = driver.connect(RemoteServer(fake_server.base_url))

    assert isinstance(failed, ReplyFailed)
    assert failed.message.startswith(f'The server at {fake_server.base_url} no longer has the model "big-model"')
    assert "does not exist" in failed.message
    assert isinstance(refused, LoadFailed) and 'does not run a model called "big-model"; it lists other-model.' in refused.message


def test_a_stream_cut_mid_reply_keeps_the_partial_text(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url))
    fake_script.failure = "cut"

    failed, _ = driver.ask()

    assert isinstance(failed, ReplyFailed)
    assert failed.partial_text == "The capital"
    assert failed.message.startswith(f"The connection to {fake_server.base_url} broke off in the middle of the reply")


def test_an_error_streamed_by_the_server_keeps_the_partial_text(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url))
    fake_script.failure = "stream_error"

    failed, _ = driver.ask()

    assert isinstance(failed, ReplyFailed) and failed.partial_text == "The capital"
    assert failed.message.endswith("stopped the reply with an error: CUDA out of memory on the server")


def test_an_answer_that_is_not_json(driver, fake_server, fake_script):
    fake_script.failure = "html"

    failed = driver.connect(RemoteServer(fake_server.base_url))

    assert isinstance(failed, LoadFailed)
    assert "answered /v1/models with something that is not JSON ('<html><body>Welcome to nginx!" in failed.message


def test_a_reply_that_is_not_json_is_named_as_such(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url))
    fake_script.failure = "html_reply"

    failed, _ = driver.ask()

    assert isinstance(failed, ReplyFailed)
    assert "answered /v1/chat/completions with something that is not JSON ('<html>Bad gateway</html>')" in failed.message


def test_a_bad_address_is_refused_before_connecting(driver):
    driver.thread.submit(ListRemoteModels("list-1", RemoteServer("ftp://example.org")))

    failed, _ = driver.wait_for(RemoteModelsListed, RemoteModelsFailed)

    assert isinstance(failed, RemoteModelsFailed)
    assert failed.message == "The address must start with http:// or https://, not ftp://."


def test_the_engine_answers_again_after_a_failure(driver, fake_server, fake_script):
    driver.connect(RemoteServer(fake_server.base_url))
    fake_script.failure = "cut"
    driver.ask("reply-1")
    fake_script.failure = ""

    finished, _ = driver.ask("reply-2")

    assert isinstance(finished, ReplyFinished) and finished.text == "The capital is Paris."
