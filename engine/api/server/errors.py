"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Raised and turned into responses on the server thread. Every failure a client can
cause ends here, never in a traceback; an unexpected one is logged and answered
with a plain 500 that names no internals.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("hearth.api")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request the server refuses; ``param`` names the offending field, ``code`` is machine-readable."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPE_BY_STATUS.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.param, exc.code)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, f"There is no endpoint {request.method} {request.url.path}.", code="unknown_url")
    if exc.status_code == 405:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}.", code="method_not_allowed")
    return error_response(exc.status_code, str(exc.detail))


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error while serving %s %s", request.method, request.url.path)
    return error_response(500, "The server failed to handle this request; see its log for details.", code="internal_error")


HANDLERS = {ApiError: on_api_error, HTTPException: on_http_error, Exception: on_unexpected}
