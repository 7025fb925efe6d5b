"""The metered path through real `eqrisk serve` processes (issue 9): keys remembered by a server
are refused within a second of a change made by another process, a paid answer is never given
to a key revoked since, and `/api/balance` reports the usage table, equal to the ledger, after
concurrent paid calls on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts, month_of
from eqrisk.accounts.db import make_engine
from helpers import Server, assert_problem, bearer, new_key

# The server's key cache keeps a record at most this long (accounts/key_cache.py); the test
# process's changes are another process's to the server, so only the TTL reaches it.
PAST_THE_TTL_S = 1.2


def _charges(accounts: Accounts, account_id: str) -> int:
    return sum(1 for e in accounts.ledger(account_id) if e["kind"] == "charge")


def test_changes_by_another_process_reach_the_server_within_a_second(home: Path) -> None:
    accounts = Accounts(make_engine(home))
    revoked_id, revoked_key = new_key(accounts)
    suspended_id, suspended_key = new_key(accounts)
    with Server(home) as server, httpx.Client(base_url=server.base, timeout=30) as client:
        for key in (revoked_key, suspended_key):  # both keys now remembered by the server
            assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
            assert client.get("/api/tickers", headers=bearer(key)).status_code == 200
        key_id = next(k["key_id"] for k in accounts.list_keys(revoked_id))
        accounts.revoke_key(key_id)
        accounts.set_state(suspended_id, "suspended")
        # At once, remembered or not, a paid answer is refused by the charge's transaction
        # (the revoked key: 401; the suspended account: 403) and nothing is charged.
        assert_problem(
            client.get("/api/metrics/NVDA", headers=bearer(revoked_key)), 401, "INVALID_API_KEY"
        )
        assert_problem(
            client.get("/api/metrics/MSFT", headers=bearer(suspended_key)),
            403,
            "ACCOUNT_INACTIVE",
        )
        assert _charges(accounts, revoked_id) == 1 and _charges(accounts, suspended_id) == 1
        # After the TTL even a free route refuses them.
        time.sleep(PAST_THE_TTL_S)
        assert_problem(
            client.get("/api/tickers", headers=bearer(revoked_key)), 401, "INVALID_API_KEY"
        )
        assert_problem(
            client.get("/api/tickers", headers=bearer(suspended_key)), 403, "ACCOUNT_INACTIVE"
        )
        # Reinstated: answered again once the TTL has passed.
        accounts.set_state(suspended_id, "verified")
        time.sleep(PAST_THE_TTL_S)
        assert client.get("/api/tickers", headers=bearer(suspended_key)).status_code == 200
        assert client.get("/api/metrics/NVDA", headers=bearer(suspended_key)).status_code == 200
    assert _charges(accounts, suspended_id) == 2
    assert accounts.balance(suspended_id) == STARTING_CREDIT_TOKENS - 500


def test_a_credit_is_seen_at_once_by_a_server_that_remembers_a_short_balance(
    home: Path,
) -> None:
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    accounts.charge(
        account_id,
        STARTING_CREDIT_TOKENS - 100,
        key_id="setup",
        route="setup",
        params_digest="",
        request_id="setup",
    )
    with Server(home) as server, httpx.Client(base_url=server.base, timeout=30) as client:
        assert_problem(
            client.get("/api/metrics/NVDA", headers=bearer(key)), 402, "INSUFFICIENT_BALANCE"
        )
        accounts.credit(account_id, 150, "top-up")  # 250 now: exactly one call
        ok = client.get("/api/metrics/NVDA", headers=bearer(key))
        assert ok.status_code == 200 and ok.headers["x-tokens-consumed"] == "250"
        assert ok.headers["x-balance-remaining-usd"] == "0.00000"
    assert accounts.balance(account_id) == 0


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_balance_reports_the_usage_table_equal_to_the_ledger_after_concurrent_calls(
    database: str, home: Path, request: pytest.FixtureRequest
) -> None:
    env = {}
    if database == "postgresql":
        url = request.getfixturevalue("pg_database_url")
        env["EQRISK_DATABASE_URL"] = url
        accounts = Accounts(make_engine(home, url))
    else:
        accounts = Accounts(make_engine(home))
    callers = [new_key(accounts, rate_limit="100000/minute") for _ in range(3)]
    # Each caller makes each of the three calls ten times (l3-decomposition costs 500 tokens).
    paths = ["/api/metrics/NVDA", "/api/heatmap?limit=5", "/api/l3-decomposition?ticker=AAPL"]

    def call(n: int) -> int:
        _, key = callers[n % 3]
        with httpx.Client(base_url=server.base, timeout=60) as client:
            return client.get(paths[(n // 3) % 3], headers=bearer(key)).status_code

    with Server(home, workers=2, **env) as server, ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(call, range(90)))
        assert statuses == [200] * 90
        docs = [
            httpx.get(f"{server.base}/api/balance", headers=bearer(key), timeout=30).json()
            for _, key in callers
        ]
    month = month_of(datetime.now(UTC))
    table = accounts.month_usage_rows()
    assert table == accounts.ledger_month_totals()
    for (account_id, _), doc in zip(callers, docs, strict=True):
        ledger = [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]
        by_route: dict[str, dict[str, int]] = {}
        for entry in ledger:
            route = by_route.setdefault(entry["route"], {"requests": 0, "tokens": 0})
            route["requests"] += 1
            route["tokens"] -= entry["tokens"]
        usage = doc["usage_this_month"]
        assert usage["by_route"] == by_route
        assert usage["requests"] == len(ledger) == 30
        assert (
            usage["tokens"] == -sum(e["tokens"] for e in ledger) == 10 * 250 + 10 * 250 + 10 * 500
        )
        assert doc["balance_tokens"] == accounts.balance(account_id)
        assert doc["balance_tokens"] == STARTING_CREDIT_TOKENS - usage["tokens"]
        assert {k: v for (a, m, k), v in table.items() if a == account_id and m == month} == {
            route: (v["requests"], v["tokens"]) for route, v in by_route.items()
        }


def test_a_charge_is_durable_once_its_answer_is_received(home: Path) -> None:
    """Paid answers received, then the server is killed (SIGKILL: no shutdown, no last
    checkpoint, its writer never checkpoints itself): every answered charge is in the
    database, each with its ledger row, and the usage table agrees."""
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    with Server(home) as server, httpx.Client(base_url=server.base, timeout=30) as client:
        answers = [client.get(f"/api/metrics/{t}", headers=bearer(key)) for t in ("NVDA", "MSFT")]
        answers += [client.get("/api/metrics/NVDA", headers=bearer(key)) for _ in range(8)]
        server.proc.kill()
        server.proc.wait(timeout=30)
    assert [a.status_code for a in answers] == [200] * 10
    charged = sum(int(a.headers["x-tokens-consumed"]) for a in answers)
    assert charged == 10 * 250
    after = Accounts(make_engine(home))
    assert after.balance(account_id) == STARTING_CREDIT_TOKENS - charged
    rows = [e for e in after.ledger(account_id) if e["kind"] == "charge"]
    assert len(rows) == 10 and -sum(e["tokens"] for e in rows) == charged
    assert after.month_usage_rows() == after.ledger_month_totals()


def test_the_served_app_keeps_what_startup_made_out_of_collections(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`eqrisk serve` builds `serving_app`: the snapshot is open and every object made so far
    is frozen (a full collection walked them all, 130-330 ms with the loop stopped)."""
    import gc

    from eqrisk.api.app import serving_app
    from eqrisk.settings import get_settings

    monkeypatch.setenv("EQRISK_HOME", str(home))
    get_settings.cache_clear()
    try:
        app = serving_app()
        assert gc.get_freeze_count() > 100_000
        assert app.state.snapshots.current().version == app.state.snapshots.current().version
    finally:
        gc.unfreeze()
        get_settings.cache_clear()
