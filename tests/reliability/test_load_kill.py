"""A bounded load on a real `eqrisk serve --workers 2` over loopback, with metered keys kept near
zero balance, and `kill -9` of one worker in the middle.

Afterwards the money is exact: every account's balance equals its credits minus its charges in
the ledger, every 2xx that reported a charge has exactly one ledger row (matched on the request
id we sent), a ledger row without a received 2xx belongs to a request that died with the worker
(a connection error on our side), errors and 402s leave no row, and nothing answered 5xx. The
killed worker is replaced by uvicorn's supervisor and the server keeps answering."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.data.master import MAG7
from helpers import Server

pytestmark = pytest.mark.reliability

LOAD_SECONDS = float(os.environ.get("EQRISK_RELIABILITY_LOAD_S", "20"))
ACCOUNTS = 6
THREADS_PER_ACCOUNT = 2
CALL_TOKENS = 250  # the price of most priced routes (0.005 USD)
START_TOKENS = 30 * CALL_TOKENS  # a few dozen calls, then the top-ups keep it near zero
TOP_UP_TOKENS = 3 * CALL_TOKENS
TOP_UP_EVERY_S = 0.5
TICKERS = [*MAG7, "SPY"]
# Service A is free by default; priced here so that both services' charges are exercised.
PRICES = {"daily": {"usd": 0.001}, "betas": {"usd": 0.001}, "facts": {"usd": 0.001}}


@dataclass
class Outcome:
    request_id: str
    account: int
    route: str
    status: int | None  # None: the connection failed (no HTTP answer)
    tokens: int
    error: str = ""


def _request(rng: random.Random) -> tuple[str, str, str, dict[str, Any] | None]:
    """(route name, method, url, json body) of one priced call with valid parameters."""
    t = rng.choice(TICKERS)
    stock = rng.choice(MAG7)
    choices = [
        ("metrics", "GET", f"/api/metrics/{t}", None),
        ("ticker-returns", "GET", f"/api/ticker-returns?ticker={t}&years=1", None),
        ("returns", "GET", f"/api/returns?ticker={stock}&years=1", None),
        ("etf-returns", "GET", "/api/etf-returns?ticker=XLK&years=1", None),
        ("l3-decomposition", "GET", f"/api/l3-decomposition?ticker={stock}", None),
        ("heatmap", "GET", "/api/heatmap?limit=20", None),
        (
            "batch/analyze",
            "POST",
            "/api/batch/analyze",
            {"tickers": rng.sample(MAG7, 3), "metrics": ["hedge_ratios"], "years": 1},
        ),
        ("daily", "GET", f"/daily?symbols={stock}&start_time=2026-06-01", None),
        ("betas", "GET", f"/betas?symbols={stock}&fact=Mkt&start_time=2026-06-01", None),
        ("facts", "GET", "/facts?fact=Mkt&start_time=2026-06-01", None),
    ]
    return rng.choice(choices)


def _funded_accounts(accounts: Accounts) -> list[tuple[str, str]]:
    """(account id, key) of verified accounts spent down to START_TOKENS (the spend is a
    ledger row too, so that balance = credits - charges holds from the start)."""
    made = []
    for n in range(ACCOUNTS):
        account_id = accounts.create_account(f"load-{n}")["account_id"]
        accounts.verify_card(account_id, provider="tests")
        key = accounts.create_key(account_id, rate_limit="1000000/minute")["key"]
        spent = accounts.charge(
            account_id,
            STARTING_CREDIT_TOKENS - START_TOKENS,
            key_id="setup",
            route="setup",
            params_digest="",
            request_id=f"setup-{n}",
        )
        assert spent.ok and spent.balance_tokens == START_TOKENS
        made.append((account_id, key))
    return made


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_load_with_a_worker_killed_keeps_the_money_exact(
    database: str,
    served_home: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    figures,
) -> None:
    env = {}
    if database == "postgresql":
        url = request.getfixturevalue("pg_database_url")
        env["EQRISK_DATABASE_URL"] = url
        accounts = Accounts(make_engine(served_home, url))
    else:
        accounts = Accounts(make_engine(served_home))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    env["EQRISK_PRICING_FILE"] = str(prices)
    funded = _funded_accounts(accounts)

    outcomes: list[Outcome] = []
    health_ms: list[float] = []
    health_statuses: Counter[int | None] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def load(account: int, key: str, seed: int, base: str) -> None:
        rng = random.Random(seed)
        headers = {"Authorization": f"Bearer {key}", "apikey": key}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            while not stop.is_set():
                route, method, url, body = _request(rng)
                rid = f"load-{uuid.uuid4().hex}"
                try:
                    resp = client.request(method, url, json=body, headers={"X-Request-ID": rid})
                except httpx.TransportError as exc:  # the worker died under this request
                    outcome = Outcome(rid, account, route, None, 0, type(exc).__name__)
                else:
                    assert resp.headers.get("x-request-id") == rid
                    tokens = int(resp.headers.get("x-tokens-consumed", "0"))
                    outcome = Outcome(rid, account, route, resp.status_code, tokens)
                with lock:
                    outcomes.append(outcome)

    def probe(base: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    status: int | None = client.get("/api/health").status_code
                except httpx.TransportError:
                    status = None
                else:
                    health_ms.append((time.perf_counter() - started) * 1000)
                health_statuses[status] += 1
                time.sleep(0.05)

    def top_up() -> None:
        while not stop.wait(TOP_UP_EVERY_S):
            for account_id, _ in funded:
                accounts.credit(account_id, TOP_UP_TOKENS, "load top-up")

    with Server(served_home, workers=2, **env) as server:
        deadline = time.monotonic() + 30
        while len(server.workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = server.workers()
        assert len(before) == 2, (before, server.log())
        threads = [
            threading.Thread(target=load, args=(n, key, 1000 * n + k, server.base))
            for n, (_, key) in enumerate(funded)
            for k in range(THREADS_PER_ACCOUNT)
        ]
        threads += [
            threading.Thread(target=probe, args=(server.base,)),
            threading.Thread(target=top_up),
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(LOAD_SECONDS * 0.4)
        victim = before[0]
        server.kill_worker(victim)
        killed_at = time.monotonic()
        replaced_after = None
        while time.monotonic() < started + LOAD_SECONDS:
            now = server.workers()
            if replaced_after is None and len(now) == 2 and victim not in now:
                replaced_after = time.monotonic() - killed_at
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        elapsed = time.monotonic() - started
        after = server.workers()
        # The server keeps answering on fresh connections, and a funded call is charged.
        for _ in range(10):
            assert httpx.get(f"{server.base}/api/health", timeout=10).status_code == 200
        account_id, key = funded[0]
        accounts.credit(account_id, CALL_TOKENS, "final call")
        final = httpx.get(
            f"{server.base}/api/metrics/NVDA",
            headers={"Authorization": f"Bearer {key}", "X-Request-ID": "final-call"},
            timeout=30,
        )
        assert final.status_code == 200, final.text
        assert final.headers["x-tokens-consumed"] == str(CALL_TOKENS)
        log = server.log()

    assert replaced_after is not None, f"worker {victim} was not replaced: {after}\n{log}"
    assert len(after) == 2 and victim not in after

    statuses = Counter(o.status for o in outcomes)
    lost = {o.request_id for o in outcomes if o.status is None}
    charged = {o.request_id: o for o in outcomes if o.status and 200 <= o.status < 300}
    charged = {rid: o for rid, o in charged.items() if o.tokens > 0}
    refused = {o.request_id for o in outcomes if o.status and o.status >= 300}
    fivexx = sum(n for s, n in statuses.items() if s and s >= 500)
    fivexx += sum(n for s, n in health_statuses.items() if s and s >= 500)
    assert fivexx == 0, (statuses, health_statuses)
    # Every call is valid: it is answered (200) or refused for the balance (402), nothing else.
    assert set(statuses) <= {200, 402, None}, statuses
    assert statuses[402] > 0, "the balances never ran short: the load did not reach zero"
    assert len(charged) >= 50, statuses

    rows_total = orphans = 0
    for n, (account_id, _) in enumerate(funded):
        ledger = accounts.ledger(account_id)
        credits = sum(e["tokens"] for e in ledger if e["tokens"] > 0)
        charges = -sum(e["tokens"] for e in ledger if e["tokens"] < 0)
        balance = accounts.balance(account_id)
        assert balance == credits - charges >= 0, (account_id, balance, credits, charges)
        rows = [e for e in ledger if e["kind"] == "charge" and e["route"] != "setup"]
        rows = [e for e in rows if e["request_id"] != "final-call"]
        by_id = Counter(e["request_id"] for e in rows)
        assert all(count == 1 for count in by_id.values()), by_id.most_common(3)
        mine = {rid: o for rid, o in charged.items() if o.account == n}
        for rid, o in mine.items():
            assert by_id[rid] == 1, f"a charged {o.status} ({o.route}) has no ledger row"
            entry = next(e for e in rows if e["request_id"] == rid)
            assert -entry["tokens"] == o.tokens and entry["route"] == o.route
        unmatched = set(by_id) - set(mine)
        assert not unmatched & refused, "a refused request was charged"
        assert unmatched <= lost, f"ledger rows for requests never sent: {unmatched - lost}"
        rows_total += len(rows)
        orphans += len(unmatched)
    assert orphans <= len(lost)
    assert len(lost) <= THREADS_PER_ACCOUNT * ACCOUNTS + 1, f"{len(lost)} connections lost"

    figures(
        database=database,
        seconds=round(elapsed, 1),
        requests=len(outcomes),
        statuses=dict(sorted((str(s), n) for s, n in statuses.items())),
        charged_2xx=len(charged),
        ledger_rows=rows_total,
        rows_without_2xx=orphans,
        connection_errors=len(lost),
        fivexx=fivexx,
        killed_worker=victim,
        replaced_after_s=round(replaced_after, 1),
        health_requests=sum(health_statuses.values()),
        health_p50_ms=round(float(np.percentile(health_ms, 50)), 1),
        health_p99_ms=round(float(np.percentile(health_ms, 99)), 1),
    )
