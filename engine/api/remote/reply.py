"""One reply from a remote server, streamed into Hearth's events (engine thread).

``RemoteReply.run`` POSTs the chat, then reads the server-sent events. Every wait
on the server wakes each ``POLL_S`` (``WatchedSocket``), so a Cancel closes the
connection within a token, or within ``POLL_S`` while the server is silent or has
not even sent its headers. A line or an event too large for any reply ends it
(``Oversized``), and so does more text than the tokens asked for could make, so a
hostile server cannot fill the memory. It emits
``PrefillDone`` at the first text (time to first token as this client measures
it, the network included), a ``TokenStreamed`` per piece of text, and at the end
``ReplyFinished`` with the client's figures plus the server's own
(``RemoteFigures``), or ``ReplyFailed`` keeping the text so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from engine.api.remote.openai_stream import (
    CHAT_PATH,
    DONE,
    FINISH_REASONS,
    SseDecoder,
    StreamChunk,
    chat_request,
    parse_chunk,
    remote_figures,
)
from engine.api.remote.http_stream import LineStream, Oversized, RemoteError, StreamEnded, open_stream
from engine.api.remote.watched_socket import Cancelled
from engine.protocol.channels import EventSink
from engine.protocol.messages import (
    FinishReason,
    Generate,
    PrefillDone,
    RemoteServer,
    ReplyFailed,
    ReplyFinished,
    RequestStats,
    TokenStreamed,
)

MAX_CHARS_PER_TOKEN = 64  # tokens average a few characters: 64 per token asked for leaves room for any real reply


@dataclass
class _Progress:
    """What the stream has said so far."""

    text: str = ""
    pieces: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    finish_reason: str | None = None
    done: bool = False
    usage: Mapping[str, object] | None = None
    timings: Mapping[str, object] | None = None
    decoder: SseDecoder = field(default_factory=SseDecoder)


class RemoteReply:
    """Streams the reply to ``request`` from ``model`` on ``server``."""

    def __init__(self, emit: EventSink, request: Generate, server: RemoteServer, model: str, context_length: int) -> None:
        self._emit = emit
        self._request = request
        self._server = server
        self._model = model
        self._context_length = context_length
        self._progress = _Progress()
        self._started = 0.0

    def run(self, is_cancelled: Callable[[], bool]) -> None:
        self._started = time.perf_counter()
        request = self._request
        body = chat_request(self._model, request.messages, request.sampling, request.constraint)
        try:
            stream = open_stream(self._server, CHAT_PATH, body, is_cancelled)
        except RemoteError as error:
            self._emit(ReplyFailed(request.request_id, self._explained(error)))
            return
        except Cancelled:
            self._finish("cancelled")
            return
        try:
            cancelled = self._read(stream, is_cancelled)
        except RemoteError as error:
            self._emit(ReplyFailed(request.request_id, str(error), self._progress.text))
            return
        finally:
            stream.close()
        self._finish("cancelled" if cancelled else FINISH_REASONS.get(self._progress.finish_reason or "", "eos"))

    def _explained(self, error: RemoteError) -> str:
        if error.status == 404:
            return (
                f'The server at {self._server.base_url} no longer has the model "{self._model}" ({error}). '
                "Connect again (File › Connect to server…) and pick one it lists."
            )
        return str(error)

    def _read(self, stream: LineStream, is_cancelled: Callable[[], bool]) -> bool:
        """Read until ``[DONE]`` or the end of the body; True when cancelled first."""
        progress = self._progress
        while not progress.done:
            if is_cancelled():  # also between lines that arrive faster than the socket is asked
                return True
            try:
                data = progress.decoder.feed(stream.next_line())
            except StreamEnded:
                self._take(progress.decoder.flush())
                self._check_complete()
                return False
            except Cancelled:
                return True
            except Oversized as error:
                raise RemoteError(
                    f"The server at {self._server.base_url} sent {error}, more than any reply needs; the reply was "
                    "stopped. What arrived is kept."
                ) from error
            except RemoteError as error:
                raise RemoteError(self._cut_message(str(error))) from error
            self._take(data)
        return False

    def _take(self, data: str | None) -> None:
        if data is None:
            return
        if data.strip() == DONE:
            self._progress.done = True
            return
        self._apply(parse_chunk(self._server.base_url, data))

    def _apply(self, chunk: StreamChunk) -> None:
        progress = self._progress
        progress.finish_reason = chunk.finish_reason or progress.finish_reason
        progress.usage = chunk.usage or progress.usage
        progress.timings = chunk.timings or progress.timings
        if not chunk.text:
            return
        asked = self._request.sampling.max_new_tokens
        if len(progress.text) + len(chunk.text) > asked * MAX_CHARS_PER_TOKEN:
            raise RemoteError(
                f"The server at {self._server.base_url} sent more than the {asked} tokens asked for; the reply was "
                "stopped. What arrived is kept."
            )
        now = time.perf_counter()
        if progress.pieces == 0:
            progress.first_at = now
            ttft_ms = (now - self._started) * 1000
            self._emit(PrefillDone(self._request.request_id, 0.0, 0, 0, ttft_ms, self._context_length))
        progress.pieces += 1
        progress.text += chunk.text
        progress.last_at = now
        elapsed = now - progress.first_at
        rate = (progress.pieces - 1) / elapsed if elapsed > 0 else 0.0
        self._emit(TokenStreamed(self._request.request_id, chunk.text, progress.pieces, rate, now))

    def _check_complete(self) -> None:
        """A body that ends before a finish reason or ``[DONE]`` was cut off."""
        if self._progress.finish_reason is None:
            raise RemoteError(self._cut_message("the server closed the stream before the reply was complete"))

    def _cut_message(self, reason: str) -> str:
        return (
            f"The connection to {self._server.base_url} broke off in the middle of the reply ({reason}). "
            "What arrived is kept; Regenerate asks again."
        )

    def _finish(self, finish_reason: FinishReason) -> None:
        progress = self._progress
        figures = remote_figures(self._server.base_url, self._model, progress.usage, progress.timings)
        tokens = figures.completion_tokens if figures.completion_tokens is not None else progress.pieces
        first = progress.first_at or time.perf_counter()
        ttft_ms = (first - self._started) * 1000
        decode_s = max(progress.last_at - first, 0.0)
        stats = RequestStats(
            prompt_tokens=figures.prompt_tokens or 0,
            reused_tokens=figures.cached_tokens or figures.cache_n or 0,
            prefill_ms=ttft_ms,
            ttft_ms=ttft_ms,
            decode_ms=decode_s * 1000,
            decode_tok_s=(tokens - 1) / decode_s if decode_s > 0 and tokens > 1 else 0.0,
            tokens_generated=tokens,
            finish_reason=finish_reason,
            context_length=self._context_length,
            started_at=self._started,
            finished_at=time.perf_counter(),
            remote=figures,
        )
        self._emit(ReplyFinished(self._request.request_id, progress.text, stats))
