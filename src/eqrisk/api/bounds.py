"""Bounded requests: the outermost check on what a client may send, before anything reads it.

A query string over `max_query_bytes` is a 414, a header block over `max_header_bytes` a 431,
a body over `max_body_bytes` a 413: announced by `Content-Length` (refused here, before a byte
of the body is read) or counted while a body without one arrives (refused as soon as the count
passes the cap; nothing past the cap is ever held). The body itself is read only by the route
that takes one (its one body parser, after the gate has checked the key), so an
unauthenticated request is refused without its body being read, and a route that takes no
body never reads one. Refusals are problem+json, free and carry the request id.
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
            length = _announced_length(scope)
            if length is not None and length > self.max_body:
                raise self._too_large(str(length))
        except ApiError as exc:
            await send_problem(send, exc, state.get("request_id"))
            return
        await self.app(scope, self._counted(receive), send)

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

    def _counted(self, receive: Receive) -> Receive:
        """`receive`, raising `PAYLOAD_TOO_LARGE` once the body passes the cap (whatever the
        headers announced: a server, or a raw caller, may stream a body without a length).
        Nothing past the cap is handed on, so nothing past it is ever held."""
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.max_body:
                    raise self._too_large(f"more than {self.max_body}")
            return message

        return counted


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
