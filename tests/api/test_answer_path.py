"""The answer path of large answers (issue 9): bodies sent in pieces, the serving process's
own settings (allocator, render threads' priority)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eqrisk.api import app as app_module
from eqrisk.api import formats
from eqrisk.api.app import create_app
from helpers import TEST_KEY


def _sent(response: formats.PiecewiseResponse) -> list[dict[str, Any]]:
    """The ASGI messages the response sends."""
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    return messages


@pytest.mark.parametrize(
    "size",
    [0, 1, formats.SEND_PIECE - 1, formats.SEND_PIECE, formats.SEND_PIECE + 1, 3_000_001],
)
def test_a_body_goes_in_pieces_that_add_up_to_it(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    messages = _sent(formats.PiecewiseResponse(body, media_type="text/csv"))
    start, *pieces = messages
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-length", str(size).encode()) in start["headers"]
    assert b"".join(p["body"] for p in pieces) == body
    assert all(type(p["body"]) is bytes and len(p["body"]) <= formats.SEND_PIECE for p in pieces)
    assert [p.get("more_body", False) for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert len(pieces) == max(1, -(-size // formats.SEND_PIECE))


def test_large_answers_arrive_whole_over_http(demo_settings) -> None:
    """An answer of several pieces, rendered and then from the render cache, is the same body
    with its Content-Length, ETag and headers."""
    client = TestClient(create_app(demo_settings))
    path = "/daily?symbols=NVDA,AAPL,MSFT&start_time=2016-01-01"
    # Identity: the pieces and the Content-Length are the rendered body's (compression, which
    # buffers the pieces, has its own tests: tests/api/test_compression.py).
    plain = {"apikey": TEST_KEY, "Accept-Encoding": "identity"}
    first = client.get(path, headers=plain)
    again = client.get(path, headers=plain)
    assert first.status_code == again.status_code == 200
    assert len(first.content) > 2 * formats.SEND_PIECE
    assert first.content == again.content
    assert first.headers["content-length"] == str(len(first.content))
    assert first.headers["etag"] == again.headers["etag"]
    assert len(first.json()) == len(again.json()) > 3000


def test_the_server_factory_tunes_its_process(demo_settings, monkeypatch) -> None:
    """`serving_app` (what `eqrisk serve` runs) sets the allocator, then builds the app;
    `keep_freed_memory` sets glibc's thresholds (mallopt says so) where there is glibc."""
    tuned: list[str] = []

    class Built(Exception):
        pass

    def build() -> None:
        tuned.append("app")
        raise Built

    monkeypatch.setattr(app_module, "keep_freed_memory", lambda: tuned.append("malloc"))
    monkeypatch.setattr(app_module, "create_app", build)
    with pytest.raises(Built):
        app_module.serving_app()
    assert tuned == ["malloc", "app"]
    monkeypatch.undo()
    assert app_module.keep_freed_memory() is (sys.platform == "linux")


@pytest.mark.skipif(sys.platform != "linux", reason="threads have their own niceness on Linux")
def test_render_threads_run_at_a_lower_priority_than_the_event_loop(demo_settings) -> None:
    app = create_app(demo_settings)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        pool = app.state.render_pool
        theirs = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert theirs.result() == min(mine + app_module.RENDER_NICENESS, 19) > mine
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        app.state.render_pool.shutdown()
