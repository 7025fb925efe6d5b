"""The HTTP protocol `eqrisk serve` runs: uvicorn's httptools protocol with a bounded head, whose
own refusals are problem+json like every other error.

httptools itself puts no limit on a request line or a header block: it buffers them whole before
the app sees the request, so a client could make a worker hold hundreds of megabytes before any
middleware runs. Here the bytes of a head are counted as they arrive; past `head_limit` the
request is refused with a problem+json 414 (still in the request line) or 431 (in the headers)
and the connection closed. Heads within the limit reach `eqrisk.api.bounds.Bounds`, which applies
the exact `max_query_bytes` / `max_header_bytes` with the same codes.

A refused client is usually still sending (the rest of its head, a body). Closing a socket with
unread bytes makes the kernel reset the connection, and a reset can reach the client before it
has read the answer, which it then never sees. So the server closes in two steps: the answer,
then its half of the connection shut (the client reads the answer and the end of it), what the
client still sends read and dropped, and the socket closed when the client closes its half or
after `LINGER_S` seconds, whichever comes first.

What uvicorn answers by itself, before any app runs, is in the same shape: a request httptools
cannot parse (a malformed request line, header or body framing; uvicorn's text/plain 400) is a
problem+json 400 `MALFORMED_REQUEST`, and a worker over its concurrency limit (uvicorn's
text/plain 503) a problem+json 503 with `Retry-After`; both close the connection.

Every answer's `Date` is the second the request's head arrived. uvicorn refreshes its `Date`
once a second on its own timer (later under load), so an answer could carry a time a second or
more before the request was made; a client that counts `X-RateLimit-Reset` from `Date` (the
dashboard does, to be independent of its own clock) would then wait a second too long.
"""

from __future__ import annotations

import asyncio
import uuid
from email.utils import formatdate
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eqrisk.api.bounds import head_limit
from eqrisk.api.errors import CODES, problem_body
from eqrisk.settings import get_settings

URL_MAX = 65535  # httptools refuses longer URLs with a bare 400; a longer line is a 414 here
RETRY_AFTER_S = 1  # a worker at its concurrency limit: try again in a second
LINGER_S = 2.0  # how long a refused connection's further bytes are read and dropped


def _problem(code: str, detail: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of a problem+json answer with a new request id that closes the
    connection."""
    status, _ = CODES[code]
    request_id = uuid.uuid4().hex
    body = problem_body(code, detail, request_id)
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
        (b"connection", b"close"),
    ]
    return status, headers, body


async def over_capacity(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer of a worker at its concurrency limit (in place of uvicorn's text/plain 503)."""
    status, headers, body = _problem(
        "SERVICE_UNAVAILABLE",
        f"this server is answering as many requests as it takes; retry in {RETRY_AFTER_S}s",
    )
    headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.head_cap = head_limit(settings.max_header_bytes, settings.max_query_bytes)
        self._in_head = True  # from the end of a message to the end of the next head
        self._head_bytes = 0
        self._line_ended = False
        self._refused = False  # answered and half closed: what arrives is dropped

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stamp_date()
        limit = self.limit_concurrency
        if limit is None or (len(self.connections) < limit and len(self.tasks) < limit):
            super().on_headers_complete()
            return
        # Over the limit: uvicorn would answer its own text/plain 503; answer ours instead.
        self.logger.warning("Exceeded concurrency limit.")
        app, self.app, self.limit_concurrency = self.app, over_capacity, None
        try:
            super().on_headers_complete()
        finally:
            self.app, self.limit_concurrency = app, limit

    def _stamp_date(self) -> None:
        """The worker's default headers (which the request's answer takes) with the `Date` of
        now, where uvicorn sends one (its `date_header`)."""
        state = self.server_state
        if state.default_headers and state.default_headers[0][0] == b"date":
            now = formatdate(usegmt=True).encode()
            if state.default_headers[0][1] != now:
                state.default_headers = [(b"date", now), *state.default_headers[1:]]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._line_ended = True, 0, False

    def data_received(self, data: bytes) -> None:
        """Count the head's bytes before the parser buffers them; refuse past the cap. (A CRLF
        split across two reads is counted a few bytes late: the cap is not that exact.)"""
        if self._refused:
            return
        if self._in_head:
            if not self._line_ended:
                eol = data.find(b"\r\n")
                line = self._head_bytes + (len(data) if eol < 0 else eol)
                if line > min(self.head_cap, URL_MAX):
                    self._refuse("URI_TOO_LONG", "request line", min(self.head_cap, URL_MAX))
                    return
                self._line_ended = eol >= 0
            end = data.find(b"\r\n\r\n")
            total = self._head_bytes + (len(data) if end < 0 else end + 4)
            if total > self.head_cap:
                self._refuse("HEADERS_TOO_LARGE", "request head", self.head_cap)
                return
            self._head_bytes = total
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse: problem+json, in place of uvicorn's text/plain."""
        self._write(
            "MALFORMED_REQUEST",
            "the request is not valid HTTP/1.1 (its request line, a header or the body's "
            "framing: Content-Length or chunked encoding); the connection is closed",
        )

    def _refuse(self, code: str, what: str, cap: int) -> None:
        self._write(
            code,
            f"the {what} passed {cap} bytes, the most this server reads (the query string "
            "and the headers have their own, smaller limits)",
        )

    def _write(self, code: str, detail: str) -> None:
        """A complete problem+json answer written straight to the socket, then the close in two
        steps (the module docstring)."""
        status, headers, body = _problem(code, detail)
        _, title = CODES[code]
        lines = [f"HTTP/1.1 {status} {title}".encode("latin-1")]
        for name, value in [*self.server_state.default_headers, *headers]:
            lines.append(name + b": " + value)
        transport: asyncio.Transport = self.transport
        transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self._refused = True
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # after the answer; the client's end closes the socket
        self.loop.call_later(LINGER_S, transport.close)
