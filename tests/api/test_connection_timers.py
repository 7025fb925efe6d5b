"""A connection's timers against a worker that is late (api/connections.py): a request head that
arrived in time is answered, however late the worker's event loop comes to read it.

The event loop runs the timers that are due before it reads the sockets that are ready, and a
timer set during a long turn of the loop counts from the turn's start. So when one turn takes
longer than the head timeout (a worker busy with a flood of connections, a slow callback), a
connection accepted in it finds its head timer due before its head is read, although the head
has been waiting in the socket since well within the timeout. Here one connection's callback
stalls the worker's loop (a real uvicorn with eqrisk's protocol, in a thread); another
connection, accepted before the stall, sends its head during it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from eqrisk.api.connections import GuardedHttpToolsProtocol
from eqrisk.settings import get_settings
from helpers import free_port, uvicorn_in_thread

TIMEOUT_S = 0.5
STALL_S = 3 * TIMEOUT_S
HEAD = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


class StallingProtocol(GuardedHttpToolsProtocol):
    """eqrisk's protocol, with the worker's loop held `STALL_S` by a request that asks for it
    (inside the loop's turn that reads the request: as a worker reading a flood is)."""

    stalled = threading.Event()

    def data_received(self, data: bytes) -> None:
        if b"X-Stall" in data:
            StallingProtocol.stalled.set()
            time.sleep(STALL_S)
        super().data_received(data)


async def answer_ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
def stalling_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, uvicorn.Server]]:
    for name in ("HEADER", "BODY", "IDLE"):
        monkeypatch.setenv(f"EQRISK_{name}_TIMEOUT_S", str(TIMEOUT_S))
    get_settings.cache_clear()
    port = free_port()
    config = uvicorn.Config(
        answer_ok,
        host="127.0.0.1",
        port=port,
        http=StallingProtocol,
        lifespan="off",
        log_level="warning",
    )
    try:
        with uvicorn_in_thread(config) as server:
            yield port, server
    finally:
        get_settings.cache_clear()


def _accepted(server: uvicorn.Server, count: int) -> None:
    """Wait until the server has accepted `count` connections."""
    deadline = time.monotonic() + 10
    while len(server.server_state.connections) < count:
        assert time.monotonic() < deadline, "the server did not accept the connections"
        time.sleep(0.01)


def _answer(sock: socket.socket) -> bytes:
    got = b""
    while b"\r\n\r\n" not in got and (chunk := sock.recv(4096)):
        got += chunk
    return got


def _until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes the connection (a timeout if it never does)."""
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


def test_a_head_sent_in_time_is_answered_when_the_worker_reads_it_late(
    stalling_server: tuple[int, uvicorn.Server],
) -> None:
    port, server = stalling_server
    StallingProtocol.stalled.clear()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as staller,
        socket.create_connection(("127.0.0.1", port), timeout=30) as late,
    ):
        _accepted(server, 2)  # `late`'s head timer runs from here
        accepted = time.monotonic()
        staller.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Stall: 1\r\n\r\n")
        assert StallingProtocol.stalled.wait(10)
        late.sendall(HEAD)  # within its timeout, while the worker is stalled
        sent_after = time.monotonic() - accepted
        answer = _answer(late)
        assert sent_after < TIMEOUT_S, sent_after
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert _answer(staller).startswith(b"HTTP/1.1 200 ")


def test_a_head_that_never_comes_is_still_timed_out_after_a_stall(
    stalling_server: tuple[int, uvicorn.Server],
) -> None:
    """The late loop's grace is for bytes that are there: a connection that sends nothing, or
    only part of its head, is answered 408 and closed as before."""
    port, server = stalling_server
    StallingProtocol.stalled.clear()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as staller,
        socket.create_connection(("127.0.0.1", port), timeout=30) as silent,
        socket.create_connection(("127.0.0.1", port), timeout=30) as partial,
    ):
        _accepted(server, 3)
        staller.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Stall: 1\r\n\r\n")
        assert StallingProtocol.stalled.wait(10)
        partial.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n")  # the head's end never comes
        for sock in (silent, partial):
            answer = _until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"connection: close" in answer
        assert _answer(staller).startswith(b"HTTP/1.1 200 ")
