"""HTTP to an OpenAI-compatible server, with the standard library (engine thread).

Why ``http.client`` and not an HTTP package: a streamed reply needs a POST whose
body is read line by line, and a way to drop the connection at once on Cancel;
``http.client`` gives both (it decodes chunked bodies, and TLS comes from
``ssl``), so the engine gains no dependency. (httpx2 is in the environment only
as huggingface_hub's dependency, which Hearth does not control.)

``normalize_base_url`` turns what the user typed into ``scheme://host[:port][/prefix]``
without the ``/v1``. ``get_json`` does one GET. ``open_stream`` POSTs and returns a
``LineStream`` of the answer's lines. Every wait on the server runs on a
``WatchedSocket``, so it ends within ``POLL_S`` of a Cancel (``Cancelled``) and
within its time limit however slowly the server sends. Nothing the server sends
is held whole beyond a limit: a line of ``MAX_LINE_BYTES``, a JSON answer of
``MAX_JSON_BYTES``. Every failure is a ``RemoteError`` whose message says what
happened and what to do.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Callable

from engine.api.remote.watched_socket import Cancelled, TooSlow, WatchedSocket, connect
from engine.protocol.messages import RemoteServer

CONNECT_TIMEOUT_S = 10.0
LIST_TIMEOUT_S = 30.0
STREAM_SILENCE_S = 300.0  # the longest a streamed reply may go without a byte (a long prompt on a busy server)
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024  # far beyond any chunk of a reply; a longer line means a broken or hostile server
SNIPPET_CHARS = 120


class RemoteError(Exception):
    """A request to the remote server failed; ``str()`` is the message for the user."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Oversized(RemoteError):
    """The server sent more in one piece than any reply needs; ``str()`` names the piece."""


class StreamEnded(Exception):
    """The server closed a streamed body normally."""


def never_cancelled() -> bool:
    return False


def normalize_base_url(text: str) -> str:
    """``http://host:port[/prefix]`` from what the user typed; raises ValueError saying what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("Enter the server's address, for example http://localhost:8000.")
    if "://" not in text:
        text = f"http://{text}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"The address must start with http:// or https://, not {parts.scheme}://.")
    if not parts.hostname:
        raise ValueError(f"The address {text!r} has no host name.")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"The port in {text!r} is not a number from 1 to 65535.") from None
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def not_json_message(base_url: str, path: str, text: str) -> str:
    snippet = text.strip()[:SNIPPET_CHARS]
    return (
        f"The server at {base_url} answered {path} with something that is not JSON ({snippet!r}). "
        "Is this the address of an OpenAI-compatible API?"
    )


def get_json(server: RemoteServer, path: str, is_cancelled: Callable[[], bool] = never_cancelled) -> object:
    """``GET {base}{path}`` as parsed JSON, within ``LIST_TIMEOUT_S`` in all; raises ``Cancelled`` on a Cancel."""
    connection, response, _ = _send(server, "GET", path, None, is_cancelled, LIST_TIMEOUT_S)
    try:
        body = response.read(MAX_JSON_BYTES)
    except TooSlow as error:
        raise RemoteError(f"The server at {server.base_url} sent {path} too slowly ({error}).") from error
    except (OSError, http.client.HTTPException) as error:
        raise RemoteError(f"The connection to {server.base_url} broke off while reading {path} ({error}).") from error
    finally:
        _hang_up(connection, response)
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise RemoteError(not_json_message(server.base_url, path, text)) from None


def open_stream(
    server: RemoteServer, path: str, payload: dict[str, object], is_cancelled: Callable[[], bool]
) -> LineStream:
    """``POST {base}{path}`` with a JSON body; the answer's body comes line by line. Raises ``Cancelled`` on a Cancel.

    The server has ``STREAM_SILENCE_S`` to start its answer (a long prompt on a busy
    server), then may pause that long between any two bytes.
    """
    body = json.dumps(payload).encode("utf-8")
    connection, response, watched = _send(server, "POST", path, body, is_cancelled, STREAM_SILENCE_S)
    content_type = response.getheader("Content-Type", "")
    if content_type and "event-stream" not in content_type:
        try:
            text = response.read(64 * 1024).decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException):
            text = ""
        finally:
            _hang_up(connection, response)
        raise RemoteError(_unstreamed_message(server.base_url, path, text))
    return LineStream(connection, response, watched)


def _unstreamed_message(base_url: str, path: str, text: str) -> str:
    """What to say when the answer to a streamed request is not an event stream."""
    try:
        data = json.loads(text)
    except ValueError:
        return not_json_message(base_url, path, text)
    reported = error_text(data)
    if reported:
        return f"The server at {base_url} answered {path} with an error: {reported}"
    return f"The server at {base_url} answered {path} in one piece instead of streaming it; it may not support streaming."


def _send(
    server: RemoteServer, method: str, path: str, body: bytes | None, is_cancelled: Callable[[], bool], deadline_s: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, WatchedSocket]:
    """Connect, send, and read the status line and headers within ``deadline_s``; an error status or a redirect is
    raised as a ``RemoteError``."""
    parts = urllib.parse.urlsplit(server.base_url)
    secure = parts.scheme == "https"
    host = parts.hostname or ""
    try:
        sock = connect(host, parts.port or (443 if secure else 80), is_cancelled, CONNECT_TIMEOUT_S)
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    except OSError as error:
        raise RemoteError(_unreachable_message(server.base_url, error)) from error
    watched = WatchedSocket(sock, is_cancelled, deadline_s)
    kind = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    connection = kind(host, parts.port)  # connected already: it writes the request and parses the answer
    connection.sock = watched  # type: ignore[assignment]
    try:
        connection.request(method, parts.path + path, body=body, headers=_headers(server, body is not None))
        response = connection.getresponse()
    except Cancelled:
        connection.close()
        raise
    except TooSlow as error:
        connection.close()
        raise RemoteError(f"The server at {server.base_url} did not answer {path} in time ({error}).") from error
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        raise RemoteError(f"The server at {server.base_url} closed the connection before answering ({error}).") from error
    if 300 <= response.status < 400:
        location = response.getheader("Location", "")
        _hang_up(connection, response)
        raise RemoteError(_redirect_message(server.base_url, path, response.status, location), response.status)
    if response.status >= 400:
        detail = _error_detail(response)
        _hang_up(connection, response)
        raise RemoteError(_status_message(server.base_url, path, response.status, detail), response.status)
    watched.allow_silence(deadline_s)
    return connection, response, watched  # the socket kept: http.client forgets it when told "Connection: close"


def _hang_up(connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
    response.close()
    connection.close()


def _redirect_message(base_url: str, path: str, status: int, location: str) -> str:
    """Redirects are not followed: the user learns the address to use instead."""
    if not location:
        return f"The server at {base_url} redirected {path} (HTTP {status}) without saying where to."
    target = urllib.parse.urljoin(f"{base_url}{path}", location.strip())[:SNIPPET_CHARS]
    return f"The server at {base_url} redirected to {target.removesuffix(path)}; use that address."


def _headers(server: RemoteServer, has_body: bool) -> dict[str, str]:
    headers = {"Accept": "text/event-stream, application/json", "User-Agent": "Hearth"}
    if has_body:
        headers["Content-Type"] = "application/json"
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    return headers


def _unreachable_message(base_url: str, error: OSError) -> str:
    if isinstance(error, ConnectionRefusedError):
        reason = "the connection was refused"
    elif isinstance(error, socket.gaierror):
        reason = "the host name is unknown"
    elif isinstance(error, TimeoutError):
        reason = f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    elif isinstance(error, ssl.SSLError):
        reason = f"the secure connection failed ({error.reason or error})"
    else:
        reason = error.strerror or str(error)
    return (
        f"Could not reach the server at {base_url}: {reason}. "
        "Check that it is running and that the address and port are right."
    )


def _error_detail(response: http.client.HTTPResponse) -> str:
    """The server's own words about an error status: the JSON ``error.message`` or ``message``, or the text."""
    try:
        text = response.read(64 * 1024).decode("utf-8", errors="replace").strip()
    except (OSError, http.client.HTTPException):  # TooSlow included: the status says enough
        return ""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return text[:SNIPPET_CHARS]
    return error_text(data)[:SNIPPET_CHARS * 4] or text[:SNIPPET_CHARS]


def error_text(data: object) -> str:
    """The message of an OpenAI-style error object: ``{"error": {"message": …}}``, or vLLM's ``{"object": "error", …}``."""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error:
        return str(error)
    return str(data.get("message", "")) if data.get("object") == "error" else ""


def _status_message(base_url: str, path: str, status: int, detail: str) -> str:
    said = f": {detail}" if detail else ""
    if status in (401, 403):
        return (
            f"The server at {base_url} refused the API key (HTTP {status}{said}). "
            "Enter the right key in File › Connect to server…."
        )
    if status == 404:
        return f"The server at {base_url} has no {path} (HTTP 404{said}). Is the address that of an OpenAI-compatible API?"
    return f"The server at {base_url} answered {path} with HTTP {status}{said}."


class LineStream:
    """The body of a streamed answer, line by line (engine thread)."""

    def __init__(
        self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse, sock: WatchedSocket
    ) -> None:
        self._connection = connection
        self._response = response
        self._sock = sock

    def next_line(self) -> str:
        """The next line without its line ending, once it has arrived.

        Raises ``StreamEnded`` when the server closed the body, ``Cancelled`` on a Cancel,
        ``Oversized`` for a line over ``MAX_LINE_BYTES`` and ``RemoteError`` when the connection broke.
        """
        try:
            line = self._response.readline(MAX_LINE_BYTES + 1)
        except (OSError, http.client.HTTPException, ValueError) as error:  # TooSlow is an OSError
            raise RemoteError(_cut_reason(error)) from error
        if not line:
            raise StreamEnded
        if len(line) > MAX_LINE_BYTES:
            raise Oversized(f"a line longer than {MAX_LINE_BYTES // 2**20} MiB")
        return line.decode("utf-8", errors="replace").rstrip("\r\n")

    def close(self) -> None:
        """Drop the connection (a cancelled reply: the server sees the client leave)."""
        self._sock.abort()
        _hang_up(self._connection, self._response)


def _cut_reason(error: BaseException) -> str:
    if isinstance(error, http.client.IncompleteRead):
        return "the server closed the connection in the middle of a chunk"
    return str(error) or type(error).__name__
