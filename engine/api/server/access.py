"""Who may talk to the server: the ``Host`` check and the API key, as ASGI middleware (server thread).

A web page can make a browser send requests to ``127.0.0.1`` under a name it
controls (DNS rebinding); refusing any ``Host`` other than the bound address or
``localhost`` stops that. On a wildcard bind (``0.0.0.0``) clients use whatever
address reaches the machine, so any IP literal is accepted there, but still no
other name; such a bind always needs an API key.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from engine.api.server.config import WILDCARD_HOSTS, ServerConfig, is_loopback
from engine.api.server.errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
OPEN_PATHS = frozenset({"/health"})  # a health probe needs no key


def host_allowed(header: str, bound: str) -> bool:
    """Whether the ``Host`` header (with or without a port) names this server."""
    name = _host_name(header)
    if name in {"localhost", bound.lower()} or (is_loopback(bound) and name in LOOPBACK_NAMES):
        return True
    if bound in WILDCARD_HOSTS:
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False
    return False


def _host_name(header: str) -> str:
    """``Host`` without its port: ``[::1]:8080`` → ``::1``, ``localhost:8080`` → ``localhost``."""
    if header.startswith("["):
        return header[1:header.find("]")].lower()
    return (header.split(":")[0] if header.count(":") == 1 else header).lower()


class AccessGuard:
    """ASGI middleware: checks ``Host`` on every request and the API key (``Authorization: Bearer KEY`` or
    Anthropic's ``x-api-key: KEY``) on all but ``/health``."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self._app = app
        self._config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is None:
            await self._app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]):
        if not host_allowed(headers.get("host", ""), self._config.host):
            return error_response(400, "The Host header does not name this server; requests through other names are refused.",
                                  code="invalid_host")
        key = self._config.api_key
        preflight = scope["method"] == "OPTIONS" and bool(self._config.cors_origins)
        if key and scope["path"] not in OPEN_PATHS and not preflight:
            given = headers.get("authorization", "")
            anthropic_key = headers.get("x-api-key", "")  # how Anthropic's clients send it
            if not (hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
                    or hmac.compare_digest(anthropic_key.encode(), key.encode())):
                message = ("An API key is required: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'."
                           if not (given or anthropic_key) else "The API key is wrong.")
                return error_response(401, message, code="invalid_api_key")
        return None
