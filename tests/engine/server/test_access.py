"""Which ``Host`` headers name this server (DNS rebinding), and which bind settings are refused."""

from __future__ import annotations

import pytest

from engine.api.server.access import host_allowed
from engine.api.server.config import ServerConfig


@pytest.mark.parametrize("header, bound, allowed", [
    ("127.0.0.1:8080", "127.0.0.1", True),
    ("localhost:8080", "127.0.0.1", True),
    ("LOCALHOST", "127.0.0.1", True),
    ("[::1]:8080", "127.0.0.1", True),
    ("attacker.example:8080", "127.0.0.1", False),
    ("127.0.0.1.attacker.example", "127.0.0.1", False),
    ("", "127.0.0.1", False),
    ("192.168.1.5:8080", "0.0.0.0", True),  # a wildcard bind is reached by whatever address the machine has
    ("attacker.example:8080", "0.0.0.0", False),  # but never under a name
    ("192.168.1.5:8080", "192.168.1.5", True),
    ("10.0.0.9:8080", "192.168.1.5", False),
])
def test_host_header(header, bound, allowed) -> None:
    assert host_allowed(header, bound) is allowed


@pytest.mark.parametrize("config, message", [
    (ServerConfig(host="0.0.0.0"), "API key"),
    (ServerConfig(host="192.168.1.5"), "API key"),
    (ServerConfig(port=70000), "port"),
    (ServerConfig(max_body_bytes=10), "body size"),
])
def test_unsafe_or_impossible_settings_are_refused(config, message) -> None:
    with pytest.raises(ValueError, match=message):
        config.check()


def test_loopback_needs_no_key_and_the_url_is_reachable() -> None:
    ServerConfig(host="::1").check()
    assert ServerConfig(host="0.0.0.0", port=9000, api_key="k").url == "http://127.0.0.1:9000/v1"
    assert ServerConfig(host="::1", port=9000).url == "http://[::1]:9000/v1"


def test_the_api_key_never_shows_in_the_configs_text() -> None:
    config = ServerConfig(host="0.0.0.0", api_key="sk-secret-123")
    assert "sk-secret-123" not in repr(config) and "sk-secret-123" not in str(config)
    assert config.api_key == "sk-secret-123"
