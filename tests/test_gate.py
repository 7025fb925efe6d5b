"""The gate in front of both services: keys, account states, credits, the demo key, rate
limits, the payment webhook; in-process, against real server processes, and on real Redis."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.db import make_engine
from eqrisk.accounts.payments import sign
from eqrisk.accounts.pricing import usd_to_tokens
from eqrisk.accounts.service import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.api.app import create_app
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"
WEBHOOK_SECRET = "whsec-test-secret"


@pytest.fixture()
def home(demo_home: Path, tmp_path: Path) -> Path:
    """A private home with the demo snapshot (accounts start empty)."""
    target = tmp_path / "home"
    shutil.copytree(demo_home / "snapshots", target / "snapshots")
    return target


@pytest.fixture()
def accounts(home: Path) -> Accounts:
    return Accounts(make_engine(home))


def new_key(
    accounts: Accounts, *, verified: bool = True, rate_limit: str = "1000/minute"
) -> tuple[str, str]:
    account_id = accounts.create_account("someone")["account_id"]
    if verified:
        accounts.verify_card(account_id, provider="operator")
    key = accounts.create_key(account_id, rate_limit=rate_limit)["key"]
    return account_id, key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def client_for(home: Path, **settings) -> TestClient:
    return TestClient(create_app(Settings(home=home, _env_file=None, **settings)))


def problem(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["error"] == code and body["status"] == status
    assert body["request_id"] == resp.headers["x-request-id"]
    return body


# ------------------------------------------------------------------------------ keys, states


def test_missing_bad_and_revoked_keys(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    body = problem(client.get("/api/metrics/NVDA"), 401, "AUTHENTICATION_REQUIRED")
    assert "Authorization: Bearer" in body["detail"]
    problem(client.get("/daily?symbols=NVDA&start_time=2026-01-02"), 401, "AUTHENTICATION_REQUIRED")
    problem(
        client.get("/api/metrics/NVDA", headers=bearer("nope-nope-nope")), 401, "INVALID_API_KEY"
    )
    _, key = new_key(accounts)
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    key_id = accounts.list_keys()[-1]["key_id"]
    accounts.revoke_key(key_id)
    body = problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 401, "INVALID_API_KEY")
    assert key not in json.dumps(body)


def test_unverified_and_suspended_accounts(home: Path, accounts: Accounts) -> None:
    client = client_for(home)
    account_id, key = new_key(accounts, verified=False)
    body = problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 403, "ACCOUNT_INACTIVE")
    assert "verify a payment card" in body["detail"]
    # Free routes work before verification.
    assert client.get("/api/tickers?mag7=true", headers=bearer(key)).status_code == 200
    accounts.verify_card(account_id, provider="operator")
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    accounts.set_state(account_id, "suspended")
    problem(client.get("/api/tickers", headers=bearer(key)), 403, "ACCOUNT_INACTIVE")
    problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 403, "ACCOUNT_INACTIVE")


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
    problem(client.get("/api/metrics/NOPE", headers=h), 404, "TICKER_NOT_FOUND")
    problem(
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
    body = problem(
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
    body = problem(client.get("/api/metrics/JPM", headers=demo), 403, "DEMO_RESTRICTED")
    assert body["allowed_tickers"] == list(MAG7) and "JPM" in body["detail"]
    body = problem(
        client.get("/api/l3-decomposition?ticker=NVDA", headers=demo), 403, "DEMO_RESTRICTED"
    )
    assert body["tokens"] == 500 and body["max_tokens"] == 250
    problem(
        client.post("/api/batch/analyze", json={"tickers": ["AAPL"]}, headers=demo),
        403,
        "DEMO_RESTRICTED",
    )
    # Service A through the same gate, key in the `apikey` header.
    problem(
        client.get(
            "/daily?symbols=AAPL,JPM&start_time=2026-01-02", headers={"apikey": "eqrisk-demo"}
        ),
        403,
        "DEMO_RESTRICTED",
    )


def test_sixth_demo_request_in_a_minute_is_429(home: Path) -> None:
    client = client_for(home)
    demo = {"X-API-Key": "eqrisk-demo"}
    for n in range(5):
        resp = client.get("/api/tickers?mag7=true", headers=demo)
        assert resp.status_code == 200
        assert resp.headers["x-ratelimit-limit"] == "5"
        assert resp.headers["x-ratelimit-remaining"] == str(4 - n)
    body = problem(client.get("/api/metrics/AAPL", headers=demo), 429, "RATE_LIMIT_EXCEEDED")
    resp = client.get("/api/metrics/AAPL", headers=demo)
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    assert resp.headers["x-ratelimit-remaining"] == "0"
    assert int(resp.headers["x-ratelimit-reset"]) >= int(time.time())
    assert "5/minute" in body["detail"]


def test_rotating_the_demo_key(home: Path) -> None:
    client_for(home)
    client = client_for(home, demo_key="another-demo-key")
    problem(client.get("/api/tickers", headers=bearer("eqrisk-demo")), 401, "INVALID_API_KEY")
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
    problem(bad, 400, "WEBHOOK_REJECTED")
    stale = client.post(
        url,
        content=body,
        headers={**headers, "X-Eqrisk-Signature": sign(WEBHOOK_SECRET, body, now - 3600)},
    )
    problem(stale, 400, "WEBHOOK_REJECTED")
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
    problem(replay, 409, "WEBHOOK_REPLAY")
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    assert accounts.get_account(account_id)["state"] == "verified"
    off = client_for(home)
    problem(off.post(url, content=body, headers=headers), 404, "NOT_FOUND")


# ------------------------------------------------------------------------------ real servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`eqrisk serve` in a child process, stopped on exit."""

    def __init__(self, home: Path, *, workers: int = 1, **env: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eqrisk.cli",
                "serve",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            env={**os.environ, "EQRISK_HOME": str(home), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            try:
                if httpx.get(f"{self.base}/api/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


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
