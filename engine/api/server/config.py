"""How the API server listens and whom it lets in (any thread; imports nothing heavy, so the app reads it at start-up)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and whom it lets in."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = field(default=None, repr=False)  # never in a log line or a traceback
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def check(self) -> None:
        """Refuse a configuration that would expose the model unprotected (``ValueError`` says why)."""
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(f"Serving on {self.host} makes the model reachable from other machines: set an API key.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"The port must be from 1 to 65535 (0: any free port), not {self.port}.")
        if self.max_body_bytes < 1024:
            raise ValueError("The body size limit must be at least 1024 bytes.")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/v1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
