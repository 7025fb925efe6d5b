"""The gate in front of both services: keys, account states, credits, the demo key, rate
limits, the payment webhook; in-process, against real server processes, and on real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.payments import sign
from eqrisk.accounts.pricing import usd_to_tokens
from eqrisk.data.master import MAG7
from helpers import (
    REDIS_URL,
    WEBHOOK_SECRET,
    Server,
    assert_problem,
    bearer,
    client_for,
    free_port,
    new_key,
)

# ------------------------------------------------------------------------------ keys, states


def test_missing_bad_and_revoked_keys(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    body = assert_problem(client.get("/api/metrics/NVDA"), 401, "AUTHENTICATION_REQUIRED")
    assert "Authorization: Bearer" in body["detail"]
    assert_problem(
        client.get("/daily?symbols=NVDA&start_time=2026-01-02"), 401, "AUTHENTICATION_REQUIRED"
    )
    assert_problem(
        client.get("/api/metrics/NVDA", headers=bearer("nope-nope-nope")), 401, "INVALID_API_KEY"
    )
    _, key = new_key(accounts)
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    key_id = accounts.list_keys()[-1]["key_id"]
    accounts.revoke_key(key_id)
    body = assert_problem(
        client.get("/api/metrics/NVDA", headers=bearer(key)), 401, "INVALID_API_KEY"
    )
    assert key not in json.dumps(body)


def test_unverified_and_suspended_accounts(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    account_id, key = new_key(accounts, verified=False)
    body = assert_problem(
        client.get("/api/metrics/NVDA", headers=bearer(key)), 403, "ACCOUNT_INACTIVE"
    )
    assert "verify a payment card" in body["detail"]
    # Free routes work before verification.
    assert client.get("/api/tickers?mag7=true", headers=bearer(key)).status_code == 200
    accounts.verify_card(account_id, provider="operator")
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    accounts.set_state(account_id, "suspended")
    assert_problem(client.get("/api/tickers", headers=bearer(key)), 403, "ACCOUNT_INACTIVE")
    assert_problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 403, "ACCOUNT_INACTIVE")


# ------------------------------------------------------------------------------ credits


def test_every_priced_call_costs_exactly_its_estimate(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    account_id, key = new_key(accounts)
    h = bearer(key)
    calls = [
        ("GET", "/api/metrics/NVDA", None, "metrics", {"ticker": "NVDA"}),
        (
            "GET",
            "/api/ticker-returns?ticker=MSFT&years=3",
            None,
            "ticker-returns",
            {"ticker": "MSFT", "years": 3},
        ),
        ("GET", "/api/returns?ticker=AAPL", None, "returns", {"ticker": "AAPL"}),
        ("GET", "/api/etf-returns?ticker=SPY", None, "etf-returns", {"ticker": "SPY"}),
        ("GET", "/api/heatmap?limit=20", None, "heatmap", {"limit": 20}),
        ("GET", "/api/l3-decomposition?ticker=NVDA", None, "l3-decomposition", {"ticker": "NVDA"}),
        (
            "POST",
            "/api/batch/analyze",
            {"tickers": ["NVDA", "AAPL", "NOPE"], "metrics": ["returns"]},
            "batch/analyze",
            {"tickers": ["NVDA", "AAPL", "NOPE"], "metrics": ["returns"]},
        ),
        (
            "POST",
            "/api/batch/analyze",
            {"tickers": [f"{t}" for t in MAG7] + ["SPY", "XLK", "XLE", "XLF", "KRE"]},
            "batch/analyze",
            {"tickers": [f"{t}" for t in MAG7] + ["SPY", "XLK", "XLE", "XLF", "KRE"]},
        ),
    ]
    expected = {"metrics": 250, "ticker-returns": 250, "returns": 250, "etf-returns": 250,
                "heatmap": 250, "l3-decomposition": 500}  # fmt: skip
    balance = accounts.balance(account_id)
    for method, url, body, endpoint, params in calls:
        est = client.post("/api/estimate", json={"endpoint": endpoint, "params": params}, headers=h)
        assert est.status_code == 200, est.text
        tokens = est.json()["estimated_tokens"]
        assert est.headers["x-tokens-consumed"] == "0"  # the estimate is free
        resp = client.request(method, url, json=body, headers=h)
        assert resp.status_code == 200, resp.text
        assert int(resp.headers["x-tokens-consumed"]) == tokens
        assert float(resp.headers["x-api-cost-usd"]) == pytest.approx(tokens * 0.00002, abs=1e-12)
        assert est.json()["estimated_cost_usd"] == pytest.approx(tokens * 0.00002, abs=1e-12)
        balance -= tokens
        assert accounts.balance(account_id) == balance
        assert float(resp.headers["x-balance-remaining-usd"]) == pytest.approx(balance * 0.00002)
        if endpoint in expected:
            assert tokens == expected[endpoint]
    # Batch: two known tickers cost the minimum 0.01; twelve cost 12 x 0.002.
    charges = [e["tokens"] for e in accounts.ledger(account_id) if e["kind"] == "charge"]
    assert -charges[-2] == usd_to_tokens("0.01") and -charges[-1] == usd_to_tokens("0.024")
    assert len(charges) == len(calls)


def test_errors_and_304_are_free(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    account_id, key = new_key(accounts)
    h = bearer(key)
    before = accounts.balance(account_id)
    assert_problem(client.get("/api/metrics/NOPE", headers=h), 404, "TICKER_NOT_FOUND")
    assert_problem(
        client.get("/api/ticker-returns?ticker=NVDA&years=0", headers=h), 400, "INVALID_PARAMETER"
    )
    assert accounts.balance(account_id) == before
    first = client.get("/api/ticker-returns?ticker=NVDA", headers=h)
    assert first.status_code == 200
    again = client.get(
        "/api/ticker-returns?ticker=NVDA", headers={**h, "If-None-Match": first.headers["etag"]}
    )
    assert again.status_code == 304 and again.headers["x-tokens-consumed"] == "0"
    assert accounts.balance(account_id) == before - 250
    assert len([e for e in accounts.ledger(account_id) if e["kind"] == "charge"]) == 1


def test_short_balance_is_402_with_the_amounts(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    account_id, key = new_key(accounts)
    accounts.charge(
        account_id,
        STARTING_CREDIT_TOKENS - 100,
        key_id="x",
        route="t",
        params_digest="",
        request_id="",
    )
    body = assert_problem(
        client.get("/api/metrics/NVDA", headers=bearer(key)), 402, "INSUFFICIENT_BALANCE"
    )
    assert body["balance_usd"] == pytest.approx(0.002) and body["required_usd"] == pytest.approx(
        0.005
    )
    assert accounts.balance(account_id) == 100
    # Free routes still answer.
    assert client.get("/api/balance", headers=bearer(key)).json()["balance_tokens"] == 100


def test_balance_reports_usage_this_month(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    _, key = new_key(accounts)
    for ticker in ("NVDA", "MSFT"):
        assert client.get(f"/api/metrics/{ticker}", headers=bearer(key)).status_code == 200
    doc = client.get("/api/balance", headers=bearer(key)).json()
    assert doc["balance_tokens"] == STARTING_CREDIT_TOKENS - 500
    assert doc["balance_usd"] == pytest.approx(19.99)
    assert doc["usage_this_month"]["requests"] == 2
    assert doc["usage_this_month"]["by_route"]["metrics"] == {"requests": 2, "tokens": 500}


# ------------------------------------------------------------------------------ demo key


def test_demo_key_rules(home: Path) -> None:
    client = client_for(home)
    demo = bearer("eqrisk-demo")
    ok = client.get("/api/metrics/NVDA", headers=demo)
    assert ok.status_code == 200 and ok.headers["x-tokens-consumed"] == "0"
    body = assert_problem(client.get("/api/metrics/JPM", headers=demo), 403, "DEMO_RESTRICTED")
    assert body["allowed_tickers"] == list(MAG7) and "JPM" in body["detail"]
    body = assert_problem(
        client.get("/api/l3-decomposition?ticker=NVDA", headers=demo), 403, "DEMO_RESTRICTED"
    )
    assert body["tokens"] == 500 and body["max_tokens"] == 250
    body = assert_problem(
        client.post("/api/batch/analyze", json={"tickers": ["AAPL", "JPM"]}, headers=demo),
        403,
        "DEMO_RESTRICTED",
    )
    assert "JPM" in body["detail"] and "AAPL" not in body["detail"].split("not ")[-1]
    # Service A through the same gate, key in the `apikey` header.
    assert_problem(
        client.get(
            "/daily?symbols=AAPL,JPM&start_time=2026-01-02", headers={"apikey": "eqrisk-demo"}
        ),
        403,
        "DEMO_RESTRICTED",
    )


def test_demo_key_sees_the_heatmap_and_a_batch_of_its_seven_tickers(home: Path) -> None:
    """The dashboard's first visit with the demo key: the heatmap restricted to the seven
    tickers and a batch over them (above the 250-token cap only through the batch's per-call
    minimum), both answered and neither charged."""
    accounts = Accounts(make_engine(home))
    _, key = new_key(accounts)
    client = client_for(home)
    demo = bearer("eqrisk-demo")
    market = client.get("/api/heatmap?limit=500", headers=bearer(key)).json()
    resp = client.get("/api/heatmap?limit=500", headers=demo)
    assert resp.status_code == 200 and resp.headers["x-tokens-consumed"] == "0"
    doc = resp.json()
    expected = [r for r in market["data"] if r["ticker"] in MAG7]
    assert len(market["data"]) > len(MAG7) and len(expected) == len(MAG7)
    assert doc["data"] == expected  # the same rows, largest first, only the seven
    assert doc["meta"]["restricted_to"] == list(MAG7) and doc["meta"]["eligible"] == 7
    assert [
        r["ticker"] for r in client.get("/api/heatmap?limit=2", headers=demo).json()["data"]
    ] == [r["ticker"] for r in expected[:2]]
    seven = {"tickers": list(MAG7), "metrics": ["hedge_ratios", "full_metrics"], "years": 1}
    resp = client.post("/api/batch/analyze", json=seven, headers=demo)
    assert resp.status_code == 200 and resp.headers["x-tokens-consumed"] == "0"
    assert resp.json()["summary"] == {"total": 7, "succeeded": 7, "failed": 0}
    assert client.get("/api/balance", headers=demo).json()["usage_this_month"]["tokens"] == 0
    # A paying key pays the batch's minimum for the same call.
    paid = client.post("/api/batch/analyze", json=seven, headers=bearer(key))
    assert paid.headers["x-tokens-consumed"] == str(usd_to_tokens("0.014"))


def test_sixth_demo_request_in_a_minute_is_429(home: Path) -> None:
    client = client_for(home)
    demo = {"X-API-Key": "eqrisk-demo"}
    for n in range(5):
        resp = client.get("/api/tickers?mag7=true", headers=demo)
        assert resp.status_code == 200
        assert resp.headers["x-ratelimit-limit"] == "5"
        assert resp.headers["x-ratelimit-remaining"] == str(4 - n)
    body = assert_problem(client.get("/api/metrics/AAPL", headers=demo), 429, "RATE_LIMIT_EXCEEDED")
    resp = client.get("/api/metrics/AAPL", headers=demo)
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    assert resp.headers["x-ratelimit-remaining"] == "0"
    assert int(resp.headers["x-ratelimit-reset"]) >= int(time.time())
    assert "5/minute" in body["detail"]


def test_rotating_the_demo_key(home: Path) -> None:
    client_for(home)
    client = client_for(home, demo_key="another-demo-key")
    assert_problem(
        client.get("/api/tickers", headers=bearer("eqrisk-demo")), 401, "INVALID_API_KEY"
    )
    assert client.get("/api/tickers", headers=bearer("another-demo-key")).status_code == 200


# ------------------------------------------------------------------------------ webhook


def test_payment_webhook(home: Path, accounts: Accounts) -> None:
    client = client_for(home, webhook_secret=WEBHOOK_SECRET)
    account_id = accounts.create_account("Hook")["account_id"]
    body = json.dumps(
        {"event_id": "evt_42", "type": "card.verified", "account_id": account_id}
    ).encode()
    now = int(time.time())
    url = "/api/webhooks/payment"
    headers = {"content-type": "application/json"}
    bad = client.post(
        url, content=body, headers={**headers, "X-Eqrisk-Signature": sign("wrong", body, now)}
    )
    assert_problem(bad, 400, "WEBHOOK_REJECTED")
    stale = client.post(
        url,
        content=body,
        headers={**headers, "X-Eqrisk-Signature": sign(WEBHOOK_SECRET, body, now - 3600)},
    )
    assert_problem(stale, 400, "WEBHOOK_REJECTED")
    assert accounts.balance(account_id) == 0
    good = client.post(
        url,
        content=body,
        headers={**headers, "X-Eqrisk-Signature": sign(WEBHOOK_SECRET, body, now)},
    )
    assert good.status_code == 200 and good.json()["starting_credit_granted"] is True
    replay = client.post(
        url,
        content=body,
        headers={**headers, "X-Eqrisk-Signature": sign(WEBHOOK_SECRET, body, now)},
    )
    assert_problem(replay, 409, "WEBHOOK_REPLAY")
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    assert accounts.get_account(account_id)["state"] == "verified"
    off = client_for(home)
    assert_problem(off.post(url, content=body, headers=headers), 404, "NOT_FOUND")


def test_webhook_signatures_of_any_bytes_are_refused_with_400(
    home: Path, accounts: Accounts
) -> None:
    """Whatever bytes the signature header holds (non-ASCII, NUL, Unicode digits, a hex digest
    with one letter swapped for a lookalike), the answer is a 400 that grants nothing."""
    client = client_for(home, webhook_secret=WEBHOOK_SECRET)
    account_id = accounts.create_account("Hook")["account_id"]
    body = json.dumps({"event_id": "evt_b", "type": "card.verified", "account_id": account_id})
    now = int(time.time())
    good = sign(WEBHOOK_SECRET, body.encode(), now)
    digest = good.split("v1=", 1)[1]
    hostile = [
        good[:-1].encode() + "\u00e4".encode("utf-8"),  # UTF-8 bytes in the digest
        good[:-1].encode() + b"\xe4",  # a latin-1 byte
        f"t={now},v1={'é' * 64}".encode(),
        f"t={now},v1={digest[:-1]}\u0430".encode(),  # Cyrillic a
        f"t=\u0661\u0662\u0663,v1={digest}".encode(),  # Arabic-Indic digits
        b"t=1\x00,v1=" + digest.encode(),
        b"\xff\xfe\xfd",
        b"t=,v1=",
        f"t={now},v1={digest}{digest}".encode(),
        b"v1=" + b"a" * 8000,
    ]
    url = "/api/webhooks/payment"
    for value in hostile:
        resp = client.post(
            url,
            content=body,
            headers={"content-type": "application/json", "X-Eqrisk-Signature": value},
        )
        assert_problem(resp, 400, "WEBHOOK_REJECTED")
    assert accounts.balance(account_id) == 0
    upper = good.replace(digest, digest.upper())  # the same digest in capitals is accepted
    ok = client.post(
        url, content=body, headers={"content-type": "application/json", "X-Eqrisk-Signature": upper}
    )
    assert ok.status_code == 200 and accounts.balance(account_id) == STARTING_CREDIT_TOKENS


# ------------------------------------------------------------------------------ real servers


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_concurrent_requests_spend_the_credit_exactly_once(
    database: str, home: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two worker processes sharing one ledger (the embedded SQLite, or the real PostgreSQL);
    the account can afford exactly 40 calls (a 0.50 USD price against the 20 USD starting
    credit); 100 calls race for them."""
    env = {}
    if database == "postgresql":
        url = request.getfixturevalue("pg_database_url")
        env["EQRISK_DATABASE_URL"] = url
        accounts = Accounts(make_engine(home, url))
    else:
        accounts = Accounts(make_engine(home))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"metrics": {"usd": 0.5}}))
    account_id, key = new_key(accounts, rate_limit="100000/minute")
    with (
        Server(home, workers=2, EQRISK_PRICING_FILE=str(prices), **env) as server,
        httpx.Client(base_url=server.base, headers=bearer(key), timeout=60) as client,
        ThreadPoolExecutor(max_workers=16) as pool,
    ):
        statuses = list(pool.map(lambda _: client.get("/api/metrics/NVDA").status_code, range(100)))
    assert statuses.count(200) == 40
    assert statuses.count(402) == 60
    assert accounts.balance(account_id) == 0
    charges = [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]
    assert len(charges) == 40
    assert -sum(e["tokens"] for e in charges) == STARTING_CREDIT_TOKENS
    assert len({e["request_id"] for e in charges}) == 40


def test_two_servers_share_one_rate_limit_count_in_redis(home: Path, accounts: Accounts) -> None:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {exc}")
    _, key = new_key(accounts, rate_limit="5/minute")
    env = {"EQRISK_REDIS_URL": REDIS_URL}
    with Server(home, **env) as one, Server(home, **env) as two:
        statuses = []
        for n in range(6):
            server = (one, two)[n % 2]
            resp = httpx.get(
                f"{server.base}/api/tickers?mag7=true", headers=bearer(key), timeout=30
            )
            statuses.append(resp.status_code)
            if n < 5:
                assert resp.headers["x-ratelimit-remaining"] == str(4 - n)
        assert statuses == [200] * 5 + [429]
        assert 1 <= int(resp.headers["retry-after"]) <= 60
        # Without Redis each process would count alone: a third server with memory storage
        # still has its own five.
    with Server(home) as alone:
        assert (
            httpx.get(f"{alone.base}/api/tickers", headers=bearer(key), timeout=30).status_code
            == 200
        )


def test_two_workers_without_redis_share_the_demo_key_limit(home: Path) -> None:
    """`serve --workers 2` and no Redis: the demo key's 5 a minute hold across both worker
    processes (a SQLite moving window under home), not 5 per worker. Requests race on fresh
    connections in rounds of 24 until the access log shows both workers answering (the kernel
    may hand a burst to one worker), all within the minute."""
    demo = {"X-API-Key": "eqrisk-demo"}

    def call(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.base, timeout=30) as client:
            return client.get("/api/tickers?mag7=true", headers=demo)

    answers: list[httpx.Response] = []
    pids: set[str] = set()
    with Server(home, workers=2) as server, ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(10):
            answers += pool.map(call, range(24))
            time.sleep(0.5)  # the access log lines are written as the requests end
            log = server.log()
            lines = [ln for ln in log.splitlines() if ln.startswith("GET /api/tickers?mag7=true ")]
            pids = {line.rsplit("pid=", 1)[1] for line in lines}
            if len(pids) == 2:
                break
    statuses = [r.status_code for r in answers]
    assert statuses.count(200) == 5 and statuses.count(429) == len(answers) - 5
    ok = [r for r in answers if r.status_code == 200]
    assert sorted(r.headers["x-ratelimit-remaining"] for r in ok) == ["0", "1", "2", "3", "4"]
    refused = next(r for r in answers if r.status_code == 429)
    assert_problem(refused, 429, "RATE_LIMIT_EXCEEDED")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "rate limits in sqlite" in log
    assert len(lines) == len(answers)
    assert len(pids) == 2  # both workers answered, and together they allowed 5
    assert (home / "ratelimits.sqlite3").is_file()


def test_two_servers_share_one_rate_limit_count_in_sqlite(home: Path) -> None:
    """Two `eqrisk serve` processes on one home with the SQLite limit store, requests
    alternating between them: one count of 5 for the demo key, not 5 each."""
    env = {"EQRISK_RATE_LIMIT_STORAGE": "sqlite"}
    demo = {"X-API-Key": "eqrisk-demo"}
    with Server(home, **env) as one, Server(home, **env) as two:
        statuses = []
        for n in range(8):
            server = (one, two)[n % 2]
            resp = httpx.get(f"{server.base}/api/tickers?mag7=true", headers=demo, timeout=30)
            statuses.append(resp.status_code)
    assert statuses == [200] * 5 + [429] * 3


def test_workers_with_memory_limits_are_refused(home: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eqrisk.cli",
            "serve",
            "--port",
            str(free_port()),
            "--workers",
            "2",
        ],
        env={**os.environ, "EQRISK_HOME": str(home), "EQRISK_RATE_LIMIT_STORAGE": "memory"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "every worker its own rate-limit count" in " ".join(proc.stderr.split())
