"""What the HTTP server answers by itself, before the app runs (api/protocol.py): a request it
cannot parse and a worker over its concurrency limit get the one error shape, problem+json,
through raw sockets against a real `eqrisk serve` and a real uvicorn."""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import Server, free_port, raw_request, uvicorn_in_thread

MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET /api/health HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
    b"GET /api/health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
    b"GET /api/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /api/health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
]


def parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, body document) of one raw HTTP/1.1 answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, json.loads(body)


def assert_raw_problem(answer: bytes, status: int, code: str) -> dict[str, Any]:
    got, headers, doc = parse(answer)
    assert got == status, answer[:300]
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(answer.partition(b"\r\n\r\n")[2])
    assert doc["error"] == code and doc["status"] == status and doc["detail"]
    assert doc["request_id"] == headers["x-request-id"]
    assert doc["type"] == f"urn:eqrisk:error:{code.lower().replace('_', '-')}"
    return doc


def test_requests_the_server_cannot_parse_are_problem_json_400s(home: Path) -> None:
    with Server(home) as server:
        for request in MALFORMED:
            doc = assert_raw_problem(raw_request(server.base, request), 400, "MALFORMED_REQUEST")
            assert "HTTP/1.1" in doc["detail"]
        # Each closed its own connection only: the server answers the next client.
        assert httpx.get(f"{server.base}/api/health", timeout=30).status_code == 200


@pytest.fixture()
def capped_server(home: Path) -> Iterator[str]:
    """The real app on a real uvicorn with eqrisk's protocol and a concurrency limit of two
    (uvicorn counts the connection asking: one held connection fills it), in this process (a
    thread), stopped after the test."""
    port = free_port()
    config = uvicorn.Config(
        create_app(Settings(home=home, _env_file=None)),
        host="127.0.0.1",
        port=port,
        http="eqrisk.api.protocol:BoundedHttpToolsProtocol",
        limit_concurrency=2,
        log_level="warning",
    )
    with uvicorn_in_thread(config):
        yield f"http://127.0.0.1:{port}"


def test_a_worker_over_its_concurrency_limit_answers_problem_json_503(capped_server: str) -> None:
    host, port = capped_server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as held:
        held.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")  # open, kept alive
        assert held.recv(65536).startswith(b"HTTP/1.1 200 ")
        answer = raw_request(capped_server, b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
        doc = assert_raw_problem(answer, 503, "SERVICE_UNAVAILABLE")
        assert parse(answer)[1]["retry-after"] == "1" and "retry" in doc["detail"]
    # Once the server has seen the held connection close, the limit admits the next one
    # (until then each try is the same 503).
    deadline = time.monotonic() + 30
    while (resp := httpx.get(f"{capped_server}/api/health", timeout=30)).status_code == 503:
        assert resp.json()["error"] == "SERVICE_UNAVAILABLE" and time.monotonic() < deadline
    assert resp.status_code == 200


def test_every_answer_is_dated_no_earlier_than_its_request(home: Path) -> None:
    """`Date` is the second the request arrived, not uvicorn's once-a-second stamp (a second
    stale at most, more under load): a client counting `X-RateLimit-Reset` from it waits no
    longer than the window. 40 requests over two seconds cross second boundaries at every
    phase of uvicorn's timer."""
    stale = []
    with Server(home) as server, httpx.Client(base_url=server.base, timeout=30) as client:
        for _ in range(40):
            sent = time.time()
            resp = client.get("/api/health")
            received = time.time()
            dated = parsedate_to_datetime(resp.headers["date"]).timestamp()
            assert dated <= received
            if dated < math.floor(sent):
                stale.append((sent, resp.headers["date"]))
            time.sleep(0.05)
    assert stale == []
