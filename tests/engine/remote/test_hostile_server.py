"""The remote runtime against servers that dribble, flood or redirect: Stop still works, memory stays bounded,
and the user is told what happened (a real engine thread; a raw-socket server on 127.0.0.1)."""

from __future__ import annotations

import socket
import time
import tracemalloc

import pytest

from engine.api.remote import http_stream
from engine.protocol.messages import (
    Cancel,
    Generate,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
)
from tests.openai_fake import QUESTION, HostileServer, RemoteDriver

STOP_WITHIN_S = 0.5
MEMORY_BOUND_BYTES = 64 * 1024 * 1024
FLOOD_BYTES = 100 * 1024 * 1024
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


@pytest.fixture
def driver():
    remote = RemoteDriver()
    yield remote
    remote.thread.stop(5)


def dribble_headers(sock: socket.socket) -> None:
    """The status line and headers, a byte every half second: never complete within a test."""
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Padding: " + b"a" * 200:
        sock.sendall(bytes([byte]))
        time.sleep(0.5)


def say_nothing(sock: socket.socket) -> None:
    """Reads the request and then waits, as a server busy with a long prompt would."""
    time.sleep(20)


def one_endless_line(sock: socket.socket) -> None:
    sock.sendall(STREAM_HEAD + b"data: ")
    piece = b"x" * 65536
    for _ in range(FLOOD_BYTES // len(piece)):
        sock.sendall(piece)


def an_event_without_end(sock: socket.socket) -> None:
    sock.sendall(STREAM_HEAD)
    line = b"data: " + b"x" * 1000 + b"\n"
    for _ in range(FLOOD_BYTES // len(line)):
        sock.sendall(line)


def endless_text(sock: socket.socket) -> None:
    sock.sendall(STREAM_HEAD)
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 1000 + b'"}}]}\n\n'
    for _ in range(FLOOD_BYTES // len(event)):
        sock.sendall(event)


def redirect(sock: socket.socket) -> None:
    sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: https://llm.example.org/v1/models\r\nContent-Length: 5\r\n\r\nmoved")


def _stop_while_waiting(driver: RemoteDriver, server: HostileServer) -> tuple[object, float]:
    assert isinstance(driver.connect(RemoteServer(server.base_url)), ModelLoaded)
    driver.thread.submit(Generate("reply-1", "chat-1", QUESTION))
    assert server.chat_asked.wait(5)
    time.sleep(1.0)  # the engine thread now waits inside the HTTP exchange
    stopped_at = time.monotonic()
    driver.thread.submit(Cancel("reply-1"))
    finished, _ = driver.wait_for(ReplyFinished, ReplyFailed, timeout=5)
    return finished, time.monotonic() - stopped_at


@pytest.mark.parametrize("answer", [dribble_headers, say_nothing])
def test_stop_ends_a_reply_whose_headers_have_not_arrived(driver, answer) -> None:
    server = HostileServer(answer)
    try:
        finished, took_s = _stop_while_waiting(driver, server)
    finally:
        server.close()

    assert isinstance(finished, ReplyFinished) and finished.stats.finish_reason == "cancelled"
    assert took_s < STOP_WITHIN_S


def test_headers_dribbled_for_longer_than_the_deadline_fail_the_reply(driver, monkeypatch) -> None:
    monkeypatch.setattr(http_stream, "STREAM_SILENCE_S", 2.0)
    server = HostileServer(dribble_headers)
    try:
        driver.connect(RemoteServer(server.base_url))
        started = time.monotonic()
        failed, _ = driver.ask()
    finally:
        server.close()

    assert isinstance(failed, ReplyFailed)
    assert failed.message == (
        f"The server at {server.base_url} did not answer /v1/chat/completions in time (no answer within 2 s)."
    )
    assert time.monotonic() - started < 4


def test_cancelling_a_connection_while_the_model_list_dribbles_in(driver) -> None:
    server = HostileServer(say_nothing, on_list=dribble_headers)
    try:
        driver.thread.submit(LoadModel("load-1", "big-model", server=RemoteServer(server.base_url)))
        time.sleep(1.0)
        stopped_at = time.monotonic()
        driver.thread.submit(Cancel("load-1"))
        failed, _ = driver.wait_for(ModelLoaded, LoadFailed, timeout=5)
    finally:
        server.close()

    assert isinstance(failed, LoadFailed) and failed.message == "Connecting was cancelled; the model in use stays."
    assert time.monotonic() - stopped_at < STOP_WITHIN_S


@pytest.mark.parametrize("answer, said", [
    (one_endless_line, "sent a line longer than 1 MiB, more than any reply needs"),
    (an_event_without_end, "sent an event larger than 1 MiB, more than any reply needs"),
    (endless_text, "sent more than the 64 tokens asked for"),
])
def test_a_flood_fails_the_reply_with_bounded_memory(driver, answer, said) -> None:
    server = HostileServer(answer)
    try:
        driver.connect(RemoteServer(server.base_url))
        tracemalloc.start()
        try:
            failed, _ = driver.ask()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        client_left = server.client_left.wait(5)
    finally:
        server.close()

    assert isinstance(failed, ReplyFailed)
    assert f"The server at {server.base_url} {said}; the reply was stopped." in failed.message
    assert peak < MEMORY_BOUND_BYTES
    assert client_left, "the client kept reading the flood"


def test_a_redirect_names_the_address_to_use(driver) -> None:
    server = HostileServer(say_nothing, on_list=redirect)
    try:
        failed = driver.connect(RemoteServer(server.base_url))
    finally:
        server.close()

    assert isinstance(failed, LoadFailed)
    assert failed.message == f"The server at {server.base_url} redirected to https://llm.example.org; use that address."


def test_stop_ends_a_connection_that_is_never_accepted(driver) -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        address = full.getsockname()
        waiting = [socket.socket() for _ in range(4)]  # fill the accept queue: further SYNs are dropped
        for sock in waiting:
            sock.setblocking(False)
            sock.connect_ex(address)
        try:
            driver.thread.submit(LoadModel("load-1", "big-model", server=RemoteServer(f"http://127.0.0.1:{address[1]}")))
            time.sleep(1.0)
            stopped_at = time.monotonic()
            driver.thread.submit(Cancel("load-1"))
            failed, _ = driver.wait_for(ModelLoaded, LoadFailed, timeout=5)
        finally:
            for sock in waiting:
                sock.close()

    assert isinstance(failed, LoadFailed) and failed.message == "Connecting was cancelled; the model in use stays."
    assert time.monotonic() - stopped_at < STOP_WITHIN_S
