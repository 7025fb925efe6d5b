"""Bounded requests: body, header and query-string limits, in process and on a real server
(a 160 MB body must be refused without the worker holding it)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.payments import sign
from eqrisk.api.bounds import head_limit
from eqrisk.api.protocol import LINGER_S
from helpers import WEBHOOK_SECRET, Server, assert_problem, bearer, client_for, new_key, raw_request

CAP = 4096


def padded(doc: dict, size: int) -> bytes:
    """`doc` as JSON, padded with trailing spaces (still valid JSON) to exactly `size` bytes."""
    raw = json.dumps(doc).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def chunks(body: bytes, step: int = 1000) -> Iterator[bytes]:
    """The body as a stream: httpx sends it chunked, without Content-Length."""
    for i in range(0, len(body), step):
        yield body[i : i + step]


def test_an_over_cap_body_is_413_everywhere_and_free(home: Path, accounts: Accounts) -> None:
    client = client_for(home, max_body_bytes=CAP, webhook_secret=WEBHOOK_SECRET)
    account_id, key = new_key(accounts)
    doc = {"tickers": ["NVDA", "AAPL"], "metrics": ["returns"]}
    big = padded(doc, CAP + 1)
    json_h = {"content-type": "application/json"}
    targets = [
        ("/api/batch/analyze", {**json_h, **bearer(key)}),  # keyed, priced by its body
        ("/api/estimate", {**json_h, **bearer(key)}),  # keyed, free
        ("/api/webhooks/payment", {**json_h, "X-Eqrisk-Signature": "t=1,v1=00"}),  # webhook
    ]
    # A route that takes no body: an announced length over the cap is refused up front; a
    # streamed body is never read (the route answers for itself).
    assert_problem(
        client.post("/api/health", content=big, headers=json_h), 413, "PAYLOAD_TOO_LARGE"
    )
    assert_problem(
        client.post("/api/health", content=chunks(big), headers=json_h), 405, "METHOD_NOT_ALLOWED"
    )
    for url, headers in targets:
        for content in (big, chunks(big)):
            resp = client.post(url, content=content, headers=headers)
            body = assert_problem(resp, 413, "PAYLOAD_TOO_LARGE")
            assert body["max_body_bytes"] == CAP
            assert f"at most {CAP} are accepted" in body["detail"]
            if isinstance(content, bytes):  # announced: refused before the gate
                assert "x-tokens-consumed" not in resp.headers
            else:  # streamed: refused while the route reads it (after the key): free
                assert resp.headers.get("x-tokens-consumed", "0") == "0"
        announced = str(CAP + 1) if isinstance(content, bytes) else f"more than {CAP}"
        assert announced in body["detail"]
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    assert [e["kind"] for e in accounts.ledger(account_id)] == ["grant"]
    # The same key, same body at exactly the cap: answered and charged (0.01 USD minimum).
    ok = client.post(
        "/api/batch/analyze", content=padded(doc, CAP), headers={**json_h, **bearer(key)}
    )
    assert ok.status_code == 200, ok.text
    assert set(ok.json()["results"]) == {"NVDA", "AAPL"}
    assert int(ok.headers["x-tokens-consumed"]) == 500
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS - 500


def test_refused_bodies_do_not_count_against_the_rate_limit(home: Path) -> None:
    client = client_for(home, max_body_bytes=CAP)
    demo = {"X-API-Key": "eqrisk-demo", "content-type": "application/json"}
    big = padded({"endpoint": "metrics", "params": {"ticker": "NVDA"}}, CAP + 10)
    for _ in range(6):
        assert_problem(
            client.post("/api/estimate", content=big, headers=demo), 413, "PAYLOAD_TOO_LARGE"
        )
    resp = client.get("/api/tickers?mag7=true", headers=demo)
    assert resp.status_code == 200 and resp.headers["x-ratelimit-remaining"] == "4"


def test_webhook_just_under_the_cap_still_works(home: Path, accounts: Accounts) -> None:
    client = client_for(home, max_body_bytes=CAP, webhook_secret=WEBHOOK_SECRET)
    account_id = accounts.create_account("Hook")["account_id"]
    body = padded({"event_id": "evt_cap", "type": "card.verified", "account_id": account_id}, CAP)
    now = int(time.time())
    resp = client.post(
        "/api/webhooks/payment",
        content=body,
        headers={
            "content-type": "application/json",
            "X-Eqrisk-Signature": sign(WEBHOOK_SECRET, body, now),
        },
    )
    assert resp.status_code == 200, resp.text
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS


def test_long_query_strings_and_large_headers(home: Path, accounts: Accounts) -> None:
    client = client_for(home, max_query_bytes=1024, max_header_bytes=2048)
    _, key = new_key(accounts)
    h = bearer(key)
    query = "ticker=NVDA&years=3&pad=" + "x" * (1024 - len("ticker=NVDA&years=3&pad="))
    assert len(query) == 1024
    # At the limit the route itself answers (here: the unknown parameter is its own 400).
    body = assert_problem(
        client.get(f"/api/ticker-returns?{query}", headers=h), 400, "INVALID_PARAMETER"
    )
    assert "pad" in body["detail"]
    body = assert_problem(
        client.get(f"/api/ticker-returns?{query}x", headers=h), 414, "URI_TOO_LONG"
    )
    assert body["max_query_bytes"] == 1024 and "1025 bytes" in body["detail"]
    assert_problem(client.get(f"/daily?{query}x", headers={"apikey": key}), 414, "URI_TOO_LONG")
    assert_problem(client.get(f"/api/health?{query}x"), 414, "URI_TOO_LONG")
    body = assert_problem(
        client.get("/api/metrics/NVDA", headers={**h, "X-Padding": "y" * 2048}),
        431,
        "HEADERS_TOO_LARGE",
    )
    assert body["max_header_bytes"] == 2048
    assert (
        client.get("/api/metrics/NVDA", headers={**h, "X-Padding": "y" * 1000}).status_code == 200
    )


# ------------------------------------------------------------------------------ real server


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_160_mb_body_is_refused_without_being_held(home: Path, accounts: Accounts) -> None:
    """Streamed without Content-Length, with the demo key and with a real key: 413 each time,
    and the worker's peak resident memory grows by less than 50 MB (it never holds the body)."""
    account_id, key = new_key(accounts)
    block = b"[" + b" " * (2**20 - 1)  # a JSON document that never ends

    def stream() -> Iterator[bytes]:
        for _ in range(160):
            yield block

    with Server(home) as server, httpx.Client(base_url=server.base, timeout=120) as client:
        client.get("/api/metrics/NVDA", headers=bearer(key))  # the worker's steady state
        before = _peak_rss_kb(server.proc.pid)
        for headers in ({"X-API-Key": "eqrisk-demo"}, bearer(key)):
            resp = client.post(
                "/api/batch/analyze",
                content=stream(),
                headers={**headers, "content-type": "application/json"},
            )
            assert_problem(resp, 413, "PAYLOAD_TOO_LARGE")
        # Announced by Content-Length: refused before the body is read.
        resp = client.post(
            "/api/batch/analyze",
            content=b"".join(stream()),
            headers={"X-API-Key": "eqrisk-demo", "content-type": "application/json"},
        )
        assert_problem(resp, 413, "PAYLOAD_TOO_LARGE")
        assert "167772160 bytes" in resp.json()["detail"]
        grown_mb = (_peak_rss_kb(server.proc.pid) - before) / 1024
        assert grown_mb < 50, f"peak RSS grew by {grown_mb:.0f} MB"
        assert client.get("/api/health").status_code == 200
    assert sorted(e["kind"] for e in accounts.ledger(account_id)) == ["charge", "grant"]


def test_a_refused_client_still_sending_reads_its_whole_answer(home: Path) -> None:
    """A head refused while the client still has megabytes of it to send: the client reads the
    whole 414 and the end of the connection, every time, not a reset (a socket closed with
    unread bytes resets the connection, and the reset can overtake the answer)."""
    limit = head_limit(16 * 2**10, 8 * 2**10)
    line = b"GET /api/health?pad=" + b"x" * (64 * limit) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    with Server(home) as server:
        for _ in range(5):
            answer = raw_request(server.base, line)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 414 Request URI too long\r\n")
            assert json.loads(body)["error"] == "URI_TOO_LONG"


def test_a_refused_client_that_never_stops_sending_is_cut_off(home: Path) -> None:
    """The refused connection's further bytes are dropped for `LINGER_S` seconds at most: a
    client that keeps sending is cut off then, not held open for as long as it sends."""
    limit = head_limit(16 * 2**10, 8 * 2**10)
    with Server(home) as server:
        host, port = server.base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /api/health?pad=" + b"x" * (2 * limit))
            started = time.monotonic()
            cut = False
            while time.monotonic() - started < 10 * LINGER_S and not cut:
                try:
                    sock.sendall(b"x" * 4096)
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                time.sleep(0.02)
            assert cut, f"still open after {10 * LINGER_S} s"
            assert time.monotonic() - started >= LINGER_S * 0.5


def test_heads_past_the_server_limit_are_refused_before_the_app(home: Path) -> None:
    """Beyond `head_limit` the server itself answers (httptools would buffer any size): a
    problem+json 414 for a request line, 431 for a header block, and closes the connection.
    Within it, the app's exact limits answer (checked in process above)."""
    limit = head_limit(16 * 2**10, 8 * 2**10)
    with Server(home) as server:
        line = b"GET /api/health?pad=" + b"x" * (2 * limit) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = raw_request(server.base, line)
        status, _, rest = answer.partition(b"\r\n")
        assert status == b"HTTP/1.1 414 Request URI too long"
        doc = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        assert doc["error"] == "URI_TOO_LONG" and str(limit) in doc["detail"]
        assert b"content-type: application/problem+json" in rest
        headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(2 * limit // 1000))
        answer = raw_request(
            server.base, b"GET /api/health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 431 Request header fields too large\r\n")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "HEADERS_TOO_LARGE"
        # A head between the app's limit and the server's: the app's exact 431.
        resp = httpx.get(f"{server.base}/api/health", headers={"X-Pad": "z" * 20000}, timeout=30)
        assert assert_problem(resp, 431, "HEADERS_TOO_LARGE")["max_header_bytes"] == 16 * 2**10
        assert httpx.get(f"{server.base}/api/health", timeout=30).status_code == 200


@pytest.mark.parametrize("value", ["0", "512"])
def test_body_limit_setting_is_validated(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from eqrisk.settings import Settings

    monkeypatch.setenv("EQRISK_MAX_BODY_BYTES", value)
    with pytest.raises(ValidationError, match="max_body_bytes"):
        Settings(_env_file=None)
    monkeypatch.setenv("EQRISK_MAX_BODY_BYTES", "2048")
    assert Settings(_env_file=None).max_body_bytes == 2048
