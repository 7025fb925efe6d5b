"""Bounded requests: the outermost check on what a client may send, before anything reads it.

A query string over `max_query_bytes` is a 414, a header block over `max_header_bytes` a 431,
a body over `max_body_bytes` a 413: announced by `Content-Length` (refused before a byte of the
body is read) or counted while a body without one arrives (refused as soon as the count passes
the cap; nothing past the cap is ever held). The body is read here, once, and replayed to the
layers below (the route's one body parser reads it), so no other layer reads the network.
Refusals are problem+json, free (they happen before the gate) and carry the request id.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eqrisk.api.errors import ApiError, problem_body

_REQUEST_LINE_SLACK = 8 * 2**10  # method, path and version next to the query string


def head_limit(max_headers: int, max_query: int) -> int:
    """Bytes of a request head (request line and headers) the server reads at most before it
    refuses the request outright: the two limits `Bounds` checks, plus room for the path.
    Heads within it reach `Bounds`, which answers the exact 414 or 431."""
    return max_headers + max_query + _REQUEST_LINE_SLACK


def header_bytes(headers: list[tuple[bytes, bytes]]) -> int:
    """Size of a header block as sent: `name: value` plus CRLF per line."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def _announced_length(scope: Scope) -> int | None:
    """The body length `Content-Length` announces, or None."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class Bounds:
    """ASGI middleware: the size limits of a request (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, max_body: int, max_headers: int, max_query: int) -> None:
        self.app = app
        self.max_body = max_body
        self.max_headers = max_headers
        self.max_query = max_query

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        try:
            self._check_head(scope)
            _, receive = await self._read_body(scope, receive)
        except ApiError as exc:
            await send_problem(send, exc, state.get("request_id"))
            return
        await self.app(scope, receive, send)

    def _check_head(self, scope: Scope) -> None:
        query = len(scope.get("query_string", b""))
        if query > self.max_query:
            raise ApiError(
                "URI_TOO_LONG",
                f"the query string has {query} bytes; at most {self.max_query} are accepted "
                "(send long lists in a POST body where the route takes one)",
                max_query_bytes=self.max_query,
            )
        size = header_bytes(scope["headers"])
        if size > self.max_headers:
            raise ApiError(
                "HEADERS_TOO_LARGE",
                f"the request headers have {size} bytes; at most {self.max_headers} are accepted",
                max_header_bytes=self.max_headers,
            )

    def _too_large(self, size: str) -> ApiError:
        return ApiError(
            "PAYLOAD_TOO_LARGE",
            f"the request body has {size} bytes; at most {self.max_body} are accepted",
            max_body_bytes=self.max_body,
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes, Receive]:
        # Read even when no body is announced: an ASGI server (or a raw caller) may still stream
        # one, and the cap must hold whatever the headers say. Without a body this is one
        # empty message.
        length = _announced_length(scope)
        if length is not None and length > self.max_body:
            raise self._too_large(str(length))
        chunks: list[bytes] = []
        size = 0
        tail: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                tail = message  # the client went away: the layers below see it too
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise self._too_large(f"more than {self.max_body}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if tail is not None:
                    return tail
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return body, replay


async def send_problem(
    send: Send, exc: ApiError, request_id: str | None, extra: dict[str, str] | None = None
) -> None:
    """A complete problem+json response sent from a middleware (outside the route handlers)."""
    body = problem_body(exc.code, exc.detail, request_id, **exc.context)
    headers = {**(extra or {}), **exc.headers, "content-type": "application/problem+json"}
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            + [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
