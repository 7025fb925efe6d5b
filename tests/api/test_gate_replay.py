"""The gate's replayed answers (issue 9, api/gate.py `Replays`): a metrics answer is made by
the route once per snapshot version and call, then replayed byte for byte with the price its
route set, still authenticated, limited, admitted and charged per request like any other."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from starlette.types import ASGIApp

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.api.gate import Gate, Priced, Replayed, Replays
from eqrisk.settings import Settings
from helpers import assert_problem, bearer, new_key, register_key

PER_REQUEST = {
    "x-request-id",
    "x-balance-remaining-usd",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "date",
}


def _gate(client: TestClient) -> Gate:
    """The application's gate middleware (the stack is built on the first request)."""
    app: Any = client.app
    layer: ASGIApp | None = app.middleware_stack
    while layer is not None and not isinstance(layer, Gate):
        layer = getattr(layer, "app", None)
    assert isinstance(layer, Gate)
    return layer


def _same_answer(a: Any, b: Any) -> None:
    """Same status, bytes and headers but for those that differ per request."""
    assert (a.status_code, a.content) == (b.status_code, b.content)
    assert {k: v for k, v in a.headers.items() if k not in PER_REQUEST} == {
        k: v for k, v in b.headers.items() if k not in PER_REQUEST
    }


def _charges(accounts: Accounts, account_id: str) -> list[dict[str, Any]]:
    return [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]


def test_a_replayed_answer_is_the_routes_and_is_charged_each_time(home: Path) -> None:
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    first = client.get("/api/metrics/NVDA", headers=bearer(key))
    gate = _gate(client)
    assert first.status_code == 200 and gate.replays.hits == 0
    again = [client.get("/api/metrics/NVDA", headers=bearer(key)) for _ in range(3)]
    assert gate.replays.hits == 3
    for answer in again:
        _same_answer(first, answer)
        assert answer.headers["x-tokens-consumed"] == "250"
        assert answer.headers["x-model-version"] == answer.json()["_metadata"]["model_version"]
        assert answer.headers["x-risk-model-version"] == answer.headers["x-model-version"]
        assert answer.headers["x-ratelimit-limit"] == first.headers["x-ratelimit-limit"]
    remaining = [int(a.headers["x-ratelimit-remaining"]) for a in [first, *again]]
    assert remaining == sorted(remaining, reverse=True) and len(set(remaining)) == 4
    balances = [float(a.headers["x-balance-remaining-usd"]) for a in [first, *again]]
    assert balances == sorted(balances, reverse=True) and len(set(balances)) == 4
    assert len(_charges(accounts, account_id)) == 4  # each answer charged once
    # The replay is the same bytes the route makes for a caller the gate has not seen.
    fresh = TestClient(create_app(Settings(home=home, _env_file=None)))
    _same_answer(fresh.get("/api/metrics/NVDA", headers=bearer(key)), again[-1])
    # Another ticker, or the same one spelt otherwise, is the route's own first answer.
    lower = client.get("/api/metrics/nvda", headers=bearer(key))
    assert lower.status_code == 200 and gate.replays.hits == 3
    assert lower.content == first.content


def test_errors_are_never_replayed_and_stay_free(home: Path) -> None:
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    for _ in range(2):
        assert_problem(
            client.get("/api/metrics/NOPE", headers=bearer(key)), 404, "TICKER_NOT_FOUND"
        )
        unknown = client.get("/api/metrics/NVDA?years=3", headers=bearer(key))
        assert_problem(unknown, 400, "INVALID_PARAMETER")
    assert _gate(client).replays.hits == 0
    assert _charges(accounts, account_id) == []


def test_a_new_snapshot_version_is_never_answered_from_the_old_ones_replays(
    demo_home: Path, tmp_path: Path
) -> None:
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.model.run import ModelParams

    home = tmp_path / "home"
    shutil.copytree(demo_home / "ingested", home / "ingested")
    first = build_snapshot(home, ModelParams())
    key = "replay-test-key-not-secret"
    register_key(home, key)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    before = [client.get("/api/metrics/NVDA", headers=bearer(key)) for _ in range(2)]
    assert _gate(client).replays.hits == 1
    assert before[1].headers["x-model-version"] == first["model_version"]

    second = build_snapshot(home, ModelParams(window=126, min_obs=63))
    after = client.get("/api/metrics/NVDA", headers=bearer(key))
    assert _gate(client).replays.hits == 1  # made by the route from the new version
    assert after.headers["x-model-version"] == second["model_version"]
    assert after.json()["_metadata"]["method"]["window"] == 126
    assert after.json()["metrics"] != before[1].json()["metrics"]
    replayed = client.get("/api/metrics/NVDA", headers=bearer(key))
    assert _gate(client).replays.hits == 2
    _same_answer(after, replayed)


def test_a_revoked_key_gets_no_replayed_answer(home: Path) -> None:
    """A key revoked by another process: the replayed call's charge refuses it at once (401,
    nothing charged); past the key cache's second the gate refuses it before any route. The
    cache's clock is the test's: its TTL is held long while the key must still be cached (a
    loaded machine can take over a second between two calls), then made zero ("past it")."""
    accounts = Accounts(make_engine(home))
    account_id, key = new_key(accounts)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    assert client.get("/api/metrics/NVDA", headers=bearer(key)).status_code == 200
    keys = _gate(client).keys
    keys.ttl_s = 3600.0
    # Another process's change (plain SQL on its own connection): this process's key cache
    # does not hear of it, only the database knows.
    key_id = next(k["key_id"] for k in accounts.list_keys(account_id))
    with sqlite3.connect(home / "accounts.db") as other:
        other.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE key_id = ?",
            (datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"), key_id),
        )
    refused = client.get("/api/metrics/NVDA", headers=bearer(key))
    assert_problem(refused, 401, "INVALID_API_KEY")
    assert _gate(client).replays.hits == 1  # replayed, then refused by the charge
    keys.ttl_s = 0.0  # past the TTL: the next request reads the key from the database
    assert_problem(client.get("/api/metrics/NVDA", headers=bearer(key)), 401, "INVALID_API_KEY")
    assert _gate(client).replays.hits == 1  # refused before the route or its replay
    assert len(_charges(accounts, account_id)) == 1


def test_replays_keep_one_version_and_a_bounded_number_of_answers() -> None:
    replays = Replays(max_items=2)
    priced = Priced("metrics", 250, 250, ("A",), "digest", replayed=True)
    a = Replayed(((b"x-model-version", b"v1"),), b"a", priced)
    replays.put("v1", "/api/metrics/A", b"", a)
    assert replays.get("v1", "/api/metrics/A", b"") is a
    assert replays.get("v1", "/api/metrics/A", b"q=1") is None
    assert replays.get("v2", "/api/metrics/A", b"") is None  # another version: not this one's
    replays.put("v1", "/api/metrics/B", b"", a)
    replays.put("v1", "/api/metrics/C", b"", a)  # the third starts the memo over
    assert replays.get("v1", "/api/metrics/A", b"") is None
    assert replays.get("v1", "/api/metrics/C", b"") is a
    replays.put("v2", "/api/metrics/A", b"", a)  # a new version drops the old one's answers
    assert replays.get("v1", "/api/metrics/C", b"") is None
    assert replays.get("v2", "/api/metrics/A", b"") is a
    assert replays.hits == 3
