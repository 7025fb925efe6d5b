"""What one client connection may hold of a worker (`eqrisk serve`'s HTTP protocol): time and a
place among a bounded number of connections (docs/decisions/outages.md).

- The request head must arrive within `header_timeout_s` of the connection's start (or of the
  first byte of a keep-alive connection's next request): else 408 problem+json, closed. uvicorn
  itself never times out a connection that has not sent a whole head (slow headers, or none).
- The body must arrive within `body_timeout_s` of the end of the head: else closed (the app, if
  it was reading it, sees the client leave and answers nothing). The app reading it is woken
  per 64 KiB of body, not per byte that arrives.
- A keep-alive connection may wait `idle_timeout_s` for its next request, also after an answer
  given before its body was read (uvicorn's timer does not cover that one).
- A timer that comes due while the client's bytes wait unread (a worker late to read its
  sockets) waits one turn of the loop for them to be read before it acts.
- At most `connection_cap()` connections per worker: `max_connections`, and always some way
  below the process's file limit, so that `accept` never fails for lack of descriptors (libuv
  then drops every pending connection, health checks included). A connection past the cap
  closes the one that has waited longest without a request being worked on (idle, or still
  sending its head or body); when every connection has a request in progress, the new one gets
  503 problem+json with `Retry-After` and is closed.
"""

from __future__ import annotations

import asyncio
import resource
import select
import uuid
from typing import Any, Literal

from eqrisk.api.errors import CODES, problem_body
from eqrisk.api.protocol import BoundedHttpToolsProtocol
from eqrisk.settings import get_settings

Phase = Literal["head", "body", "app", "idle"]
# Descriptors a worker keeps for itself beside its client connections (database and Redis
# pools, snapshot files, SQLite, logs): the cap stays this far below the file limit.
RESERVED_FDS = 256
WAKE_BYTES = 64 * 1024  # body bytes gathered before the app reading them is woken
# A due timer's wait for bytes already sent to be read (`_expired`): any positive delay puts
# the next check after the loop's next read of its sockets.
LATE_READ_S = 0.001


def connection_cap(max_connections: int) -> int:
    """The most client connections one worker keeps open: `max_connections`, lowered to stay
    `RESERVED_FDS` (or an eighth of the limit, whichever is more) below the file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(16, min(max_connections, soft - max(RESERVED_FDS, soft // 8)))


def raise_file_limit(ceiling: int = 65_536) -> int:
    """Raise this process's soft file limit to its hard limit (at most `ceiling`): the
    default soft limit (often 1,024) is what bounds open connections otherwise. Children
    (the workers) inherit it. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft
        return want
    return soft


def raw_problem(code: str, detail: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole problem+json response, as bytes for the socket, that closes the connection (for
    answers given outside any request cycle)."""
    status, title = CODES[code]
    request_id = uuid.uuid4().hex
    body = problem_body(code, detail, request_id)
    lines = [
        f"HTTP/1.1 {status} {title}",
        "content-type: application/problem+json",
        f"content-length: {len(body)}",
        f"x-request-id: {request_id}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
        "connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class GuardedHttpToolsProtocol(BoundedHttpToolsProtocol):
    """uvicorn's httptools protocol (with the bounded head of `BoundedHttpToolsProtocol`) with
    the timeouts and the connection cap of the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.header_timeout_s = settings.header_timeout_s
        self.body_timeout_s = settings.body_timeout_s
        # uvicorn's own keep-alive timer runs too, set no shorter (`eqrisk serve`).
        self.idle_timeout_s = settings.idle_timeout_s
        self.cap = connection_cap(settings.max_connections)
        self.phase: Phase = "head"
        self.phase_since = 0.0
        self._body_done = False
        self._timer: asyncio.TimerHandle | None = None

    # -- phases and their timers ----------------------------------------------------------
    def _enter(self, phase: Phase, timeout: float | None = None) -> None:
        self.phase = phase
        self.phase_since = self.loop.time()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if timeout is not None:
            self._timer = self.loop.call_later(timeout, self._expired, phase)

    def _expired(self, phase: Phase, read_first: bool = True) -> None:
        """`phase`'s timer is due. The loop runs due timers before it reads ready sockets, and
        a timer set in a long turn of the loop counts from the turn's start: a worker that is
        late (a flood, a slow callback) finds a timer due while bytes the client sent in time
        wait unread. Then the timer waits one turn of the loop, in which they are read, and is
        final: a client trickling its head gets no more time than that."""
        self._timer = None
        if self.phase != phase or self.transport is None or self.transport.is_closing():
            return
        if read_first and self._bytes_waiting():
            self._timer = self.loop.call_later(LATE_READ_S, self._expired, phase, False)
            return
        if phase == "head":
            detail = f"the request head did not arrive within {self.header_timeout_s:g} s"
            self.transport.write(raw_problem("REQUEST_TIMEOUT", detail))
        self.transport.close()

    def _bytes_waiting(self) -> bool:
        """Whether the client has sent bytes (or its end) this worker has not read yet."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._enter("head", self.header_timeout_s)
        if len(self.connections) > self.cap:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.phase == "idle":  # a keep-alive connection's next request begins
            self._enter("head", self.header_timeout_s)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._body_done = False
        self._enter("body", self.body_timeout_s)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """uvicorn wakes the app for every piece of body that arrives: a client trickling a
        byte at a time made each byte a task switch and a trip through the app's receive (a
        few hundred such clients stalled the worker). Here the app is woken when `WAKE_BYTES`
        have gathered, or the body is complete (`on_message_complete` wakes it)."""
        cycle = self.cycle
        if cycle.response_complete or len(cycle.body) + len(body) >= WAKE_BYTES:
            super().on_body(body)
        else:
            cycle.body += body

    def on_message_complete(self) -> None:
        self._body_done = True
        if self.cycle.response_complete:  # answered before its body was read (a 401, a 413)
            self._enter("idle", self.idle_timeout_s)
        else:
            self._enter("app")
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_done and self.phase == "app":
            self._enter("idle", self.idle_timeout_s)

    # -- the cap ------------------------------------------------------------------------------
    def _make_room(self) -> None:
        """Past the cap: close the connection that waited longest without a request being
        worked on; none (all busy): refuse this one."""
        victim: GuardedHttpToolsProtocol | None = None
        for other in self.connections:
            if (
                other is not self
                and isinstance(other, GuardedHttpToolsProtocol)
                and other.phase != "app"
                and not other.transport.is_closing()
                and (victim is None or other.phase_since < victim.phase_since)
            ):
                victim = other
        if victim is not None:
            victim.transport.close()
            return
        detail = f"this server holds {self.cap} connections, each with a request in progress"
        self.transport.write(raw_problem("SERVICE_UNAVAILABLE", detail, {"retry-after": "1"}))
        self.transport.close()
