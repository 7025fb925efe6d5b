"""The HTTP protocol `eqrisk serve` runs: uvicorn's httptools protocol with a bounded head.

httptools itself puts no limit on a request line or a header block: it buffers them whole before
the app sees the request, so a client could make a worker hold hundreds of megabytes before any
middleware runs. Here the bytes of a head are counted as they arrive; past `head_limit` the
request is refused with a problem+json 414 (still in the request line) or 431 (in the headers)
and the connection closed. Heads within the limit reach `eqrisk.api.bounds.Bounds`, which applies
the exact `max_query_bytes` / `max_header_bytes` with the same codes.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eqrisk.api.bounds import head_limit
from eqrisk.api.errors import CODES, problem_body
from eqrisk.settings import get_settings

URL_MAX = 65535  # httptools refuses longer URLs with a bare 400; a longer line is a 414 here


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.head_cap = head_limit(settings.max_header_bytes, settings.max_query_bytes)
        self._in_head = True  # from the end of a message to the end of the next head
        self._head_bytes = 0
        self._line_ended = False

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._line_ended = True, 0, False

    def data_received(self, data: bytes) -> None:
        """Count the head's bytes before the parser buffers them; refuse past the cap. (A CRLF
        split across two reads is counted a few bytes late: the cap is not that exact.)"""
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

    def _refuse(self, code: str, what: str, cap: int) -> None:
        """A complete problem+json answer written straight to the socket, then close."""
        status, title = CODES[code]
        request_id = uuid.uuid4().hex
        body = problem_body(
            code,
            f"the {what} passed {cap} bytes, the most this server reads (the query string "
            "and the headers have their own, smaller limits)",
            request_id,
        )
        head = (
            f"HTTP/1.1 {status} {title}\r\ncontent-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\nx-request-id: {request_id}\r\n"
            "connection: close\r\n\r\n"
        ).encode("latin-1")
        transport: asyncio.Transport = self.transport
        transport.write(head + body)
        transport.close()
