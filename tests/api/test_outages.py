"""Backends failing under the app, in process (issue 21, items 3 and 4; the loaded runs on a real
server are in tests/reliability): PostgreSQL and Redis behind a TCP proxy that is cut, what
answers 503 and what goes on, `/api/ready`, the database's state machine, the order of the key
check and the body read, and the limit on unknown keys per client address."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError as SAOperationalError

from eqrisk.accounts.backends import Backend, BackendUnavailable, database_outage
from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.key_cache import KeyCache
from eqrisk.accounts.limits import FailedKeys, RateLimiter
from eqrisk.api.gate import Gate
from eqrisk.settings import Settings
from helpers import REDIS_URL, assert_problem, bearer, client_for, new_key
from proxy import Proxy

RETRY_S = 0.3
FAST = {
    "database_connect_timeout_s": 2,
    "database_timeout_s": 1.0,
    "redis_connect_timeout_s": 0.5,
    "redis_timeout_s": 0.5,
    "backend_retry_s": RETRY_S,
}


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("database_connect_timeout_s", "1"),  # libpq's minimum is 2 s
        ("database_timeout_s", "0"),
        ("redis_timeout_s", "-1"),
        ("backend_retry_s", "0"),
        ("header_timeout_s", "0"),
        ("max_connections", "8"),
        ("invalid_key_limit", "many"),
    ],
)
def test_backend_and_connection_settings_are_validated(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"EQRISK_{name.upper()}", value)
    with pytest.raises(ValidationError, match=name):
        Settings(_env_file=None)


def test_backend_and_connection_defaults_are_a_few_seconds() -> None:
    s = Settings(_env_file=None)
    assert (s.database_connect_timeout_s, s.database_timeout_s) == (3, 5.0)
    assert (s.redis_connect_timeout_s, s.redis_timeout_s, s.backend_retry_s) == (2.0, 2.0, 1.0)
    assert (s.header_timeout_s, s.body_timeout_s, s.idle_timeout_s) == (10.0, 30.0, 5.0)
    assert s.invalid_key_limit == "20/minute"


# ------------------------------------------------------------------------------ the state


def test_a_backend_fails_fast_while_down_and_one_call_tries_it_again() -> None:
    backend = Backend("database", is_outage=database_outage, retry_s=RETRY_S)
    assert backend.state().state == "unknown"
    with backend.guard():
        pass
    assert backend.state().state == "up"
    refused = psycopg.OperationalError("connection refused")
    with pytest.raises(BackendUnavailable) as first, backend.guard():
        raise refused
    assert first.value.__cause__ is refused and first.value.retry_after_s == 1
    state = backend.state()
    assert (state.state, state.error) == ("down", "connection refused")
    calls = []
    with pytest.raises(BackendUnavailable), backend.guard():  # refused at once: not tried
        calls.append(1)
    assert calls == [] and backend.down
    time.sleep(RETRY_S)
    assert not backend.down
    with backend.guard():  # one call tries it, and succeeds
        calls.append(2)
    assert calls == [2] and backend.state().state == "up"
    # An error that is the statement's, not the database's, passes through unchanged.
    with pytest.raises(psycopg.errors.UniqueViolation), backend.guard():
        raise psycopg.errors.UniqueViolation("duplicate key")
    assert backend.state().state == "up" and backend.failures == 1


def test_what_counts_as_a_database_outage() -> None:
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = 5  # type: ignore[attr-defined]
    syntax = sqlite3.OperationalError("near 'SELEC': syntax error")
    syntax.sqlite_errorcode = 1  # type: ignore[attr-defined]
    assert database_outage(busy) and not database_outage(syntax)
    assert database_outage(psycopg.errors.QueryCanceled("statement timeout"))
    assert database_outage(psycopg.errors.AdminShutdown("terminating connection"))
    assert not database_outage(psycopg.errors.UndefinedTable("no such table"))
    wrapped = SAOperationalError("SELECT 1", {}, psycopg.OperationalError("refused"))
    assert database_outage(wrapped)


# ------------------------------------------------------------------------------ readiness


def test_ready_reports_each_backend_and_is_503_without_a_snapshot(
    home: Path, tmp_path: Path
) -> None:
    resp = client_for(home).get("/api/ready")
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["ready"] is True
    assert doc["snapshot"]["state"] == "up" and doc["snapshot"]["version"].startswith("v")
    assert doc["database"]["state"] == "up" and doc["database"]["kind"] == "sqlite"
    assert doc["redis"] == {"state": "off", "since": doc["redis"]["since"], "limits": "memory"}
    empty = client_for(tmp_path / "empty")
    body = assert_problem(empty.get("/api/ready"), 503, "SERVICE_UNAVAILABLE")
    assert body["ready"] is False and body["snapshot"]["state"] == "down"
    assert body["database"]["state"] == "up"
    assert empty.get("/api/ready").headers["retry-after"] == "1"
    assert empty.get("/api/health").status_code == 503  # liveness says why, as before


# ------------------------------------------------------------------------------ PostgreSQL cut


@pytest.fixture()
def pg_through(pg_database_url: str, home: Path) -> Any:
    """(proxy, settings) of an app that reaches PostgreSQL through a proxy."""
    direct = make_url(pg_database_url)
    with Proxy(direct.port or 5432) as proxy:
        url = direct.set(port=proxy.port).render_as_string(hide_password=False)
        yield proxy, {**FAST, "database_url": url}


def test_database_cut_503_for_priced_calls_known_keys_go_on_free(
    pg_through: Any, pg_database_url: str, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, settings = pg_through
    accounts = Accounts(make_engine(home, pg_database_url))
    account_id, key = new_key(accounts)
    _, unknown = new_key(accounts)  # never used before the cut: this process does not know it
    client = client_for(home, **settings)
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    assert (
        client.get("/daily?symbols=NVDA&start_time=2026-06-01", headers={"apikey": key}).status_code
        == 200
    )
    balance = accounts.balance(account_id)
    time.sleep(1.05)  # past the key cache's second: known, no longer fresh
    proxy.cut()
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    paid = client.get("/api/metrics/AAPL", headers=bearer(key))
    took = time.monotonic() - started
    body = assert_problem(paid, 503, "SERVICE_UNAVAILABLE")
    assert body["backend"] == "database" and "nothing was charged" in body["detail"]
    assert int(paid.headers["retry-after"]) >= 1
    assert paid.headers.get("x-tokens-consumed", "0") == "0"  # nothing charged
    assert took < FAST["database_timeout_s"] + FAST["database_connect_timeout_s"]
    # Free calls of a key this process knows go on; an unknown key cannot be checked.
    free = client.get("/daily?symbols=NVDA&start_time=2026-06-01", headers={"apikey": key})
    assert free.status_code == 200 and free.headers["x-tokens-consumed"] == "0"
    assert_problem(
        client.get("/daily?symbols=NVDA&start_time=2026-06-01", headers={"apikey": unknown}),
        503,
        "SERVICE_UNAVAILABLE",
    )
    assert_problem(client.get("/api/balance", headers=bearer(key)), 503, "SERVICE_UNAVAILABLE")
    ready = client.get("/api/ready")
    assert ready.status_code == 503 and ready.json()["database"]["state"] == "down"
    assert "error" not in ready.json()["database"]  # drivers' messages stay in the log
    assert client.get("/api/health").status_code == 200  # liveness: the process answers
    lines = [r for r in caplog.records if r.getMessage().startswith("503 database unavailable")]
    assert len(lines) == 3 and not any(r.exc_info for r in caplog.records)
    proxy.restore()
    time.sleep(RETRY_S)
    again = client.get("/api/metrics/AAPL", headers=bearer(key))
    assert again.status_code == 200 and again.headers["x-tokens-consumed"] == "250"
    assert client.get("/api/ready").status_code == 200
    assert accounts.balance(account_id) == balance - 250  # the 503 was not charged


# ------------------------------------------------------------------------------ Redis cut


def test_redis_cut_limits_count_per_process_and_nothing_is_refused_for_it(home: Path) -> None:
    port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    accounts = Accounts(make_engine(home))
    _, key = new_key(accounts, rate_limit="1000/minute")
    with Proxy(port) as proxy:
        client = client_for(home, redis_url=f"redis://127.0.0.1:{proxy.port}/0", **FAST)
        limiter = client.app.state.limiter  # type: ignore[attr-defined]
        assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
        assert limiter.backend.state().state == "up"
        proxy.cut()
        for _ in range(3):
            resp = client.get("/api/metrics/NVDA", headers=bearer(key))
            assert resp.status_code == 200 and int(resp.headers["x-ratelimit-remaining"]) < 1000
        assert limiter.fallback_hits == 3 and limiter.backend.state().state == "down"
        # The demo key's 5 a minute still hold, counted in this process.
        demo = {"X-API-Key": "eqrisk-demo"}
        statuses = [
            client.get("/api/tickers?mag7=true", headers=demo).status_code for _ in range(6)
        ]
        assert statuses == [200] * 5 + [429]
        ready = client.get("/api/ready")
        assert ready.status_code == 200 and ready.json()["redis"]["state"] == "down"
        proxy.restore()
        time.sleep(RETRY_S)
        assert client.get("/api/ready").json()["redis"]["state"] == "up"


# ------------------------------------------------------------------------------ keys and bodies


async def _asgi(
    app: Any, headers: list[tuple[bytes, bytes]], client: str, *, body: bool = False
) -> tuple[int, bool]:
    """A POST announcing 1 MiB whose body never comes (`body`: an empty one does): (status,
    whether the body was asked for)."""
    asked = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked = True
        if body:
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/batch/analyze",
        "raw_path": b"/api/batch/analyze",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", b"1048576"),
            *headers,
        ],
        "client": (client, 40000),
        "server": ("127.0.0.1", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), asked


def test_the_key_is_checked_before_the_body_is_read(home: Path) -> None:
    app = client_for(home).app
    for headers in ([], [(b"authorization", b"Bearer not-a-key")]):
        status, asked = asyncio.run(_asgi(app, headers, "10.0.0.1"))
        assert status == 401 and not asked


def test_unknown_keys_are_limited_per_client_address(home: Path, accounts: Accounts) -> None:
    _, key = new_key(accounts)
    client = client_for(home, invalid_key_limit="3/minute")
    bad = bearer("eqk_guess_" + "x" * 40)
    for _ in range(3):
        assert_problem(client.get("/api/metrics/NVDA", headers=bad), 401, "INVALID_API_KEY")
    refused = client.get("/api/metrics/NVDA", headers=bad)
    body = assert_problem(refused, 429, "RATE_LIMIT_EXCEEDED")
    assert 1 <= int(refused.headers["retry-after"]) <= 60 and body["limit"] == "3/minute"
    # From that address no key is let in now, a good one included (remembered or not: below)...
    assert_problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 429, "RATE_LIMIT_EXCEEDED")
    # ...while another address is not concerned.
    app = client.app
    auth = [(b"authorization", b"Bearer " + key.encode())]
    status, asked = asyncio.run(_asgi(app, auth, "10.0.0.9", body=True))
    assert asked and status == 400  # let in, its (empty) body read and refused by the route


async def _let_in(scope: Any, receive: Any, send: Any) -> None:
    """The app behind the gate in the next test: 418 says the gate let the call in."""
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_locked_address_is_refused_even_with_a_key_the_gate_remembers(
    accounts: Accounts,
) -> None:
    """A good key the gate's cache holds does not open an address locked for unknown keys: a
    right guess is refused as a wrong one is (the lock tells a guesser nothing, not even which
    keys were used of late), and the refusal does not depend on what the cache holds."""
    _, key = new_key(accounts)
    limiter = RateLimiter()  # in-process counters
    keys = KeyCache(accounts, ttl_s=600)  # remembered for the whole test
    gate = Gate(
        _let_in,
        accounts=accounts,
        limiter=limiter,
        keyed=lambda path: "risk",
        keys=keys,
        failed_keys=FailedKeys(limiter, "3/minute"),
    )

    def status(presented: str, address: str) -> int:
        auth = [(b"authorization", b"Bearer " + presented.encode())]
        return asyncio.run(_asgi(gate, auth, address, body=True))[0]

    assert status(key, "10.0.0.1") == 418
    assert keys.cached(key) is not None
    assert [status("eqk_guess_" + "x" * 40, "10.0.0.1") for _ in range(4)] == [401, 401, 401, 429]
    assert keys.cached(key) is not None  # still remembered, and still refused from there
    assert status(key, "10.0.0.1") == 429
    assert status(key, "10.0.0.9") == 418  # another address is not concerned
