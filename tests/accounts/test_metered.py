"""The metered path's accounts side (issue 9): group charges, the per-process charge writer,
the monthly usage table (and its one-time fill for an old database), the key cache and the
in-memory rate window; on SQLite and on the machine's real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, insert, text, update

from eqrisk.accounts import db
from eqrisk.accounts.backends import Backend, database_outage
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts, ChargeRequest, month_of
from eqrisk.accounts.key_cache import KeyCache
from eqrisk.accounts.limits import MemoryWindow
from eqrisk.accounts.writer import ChargeWriter


@pytest.fixture(params=["sqlite", "postgresql"])
def accounts(request, tmp_path: Path) -> Accounts:
    if request.param == "sqlite":
        return Accounts(db.make_engine(tmp_path))
    url = request.getfixturevalue("pg_database_url")
    engine = db.make_engine(tmp_path, url)
    with engine.begin() as conn:
        for table in reversed(db.metadata.sorted_tables):
            conn.execute(table.delete())
    return Accounts(engine)


def _funded(accounts: Accounts, name: str) -> tuple[str, str]:
    """(account id, key id) of a verified account holding the starting credit."""
    account_id = accounts.create_account(name)["account_id"]
    accounts.verify_card(account_id, provider="tests")
    return account_id, accounts.create_key(account_id)["key_id"]


def _charge(account_id: str, key_id: str, tokens: int, n: int, route: str = "metrics"):
    return ChargeRequest(account_id, tokens, key_id, route, "digest", f"req-{n}")


def test_a_group_decides_each_charge_in_order_as_if_alone(accounts: Accounts) -> None:
    a, ka = _funded(accounts, "A")
    b, kb = _funded(accounts, "B")
    idle = accounts.create_account("never verified")["account_id"]
    accounts.credit(idle, 1000, "goodwill")
    revoked = accounts.create_key(b)["key_id"]
    accounts.revoke_key(revoked)
    third = STARTING_CREDIT_TOKENS // 3  # A affords three of these, not four
    group = [
        _charge(a, ka, third, 0),
        _charge(b, kb, 100, 1),
        _charge(a, ka, third, 2),
        _charge(a, ka, third, 3),
        _charge(a, ka, third, 4),  # refused: A's balance is 1 token now
        _charge(a, ka, 1, 5),  # and this one fits exactly
        _charge(idle, "k", 10, 6),  # refused: not verified
        _charge(b, revoked, 10, 7),  # refused: the key was revoked
    ]
    out = accounts.charge_many(group)
    assert [c.ok for c in out] == [True, True, True, True, False, True, False, False]
    left_a = STARTING_CREDIT_TOKENS - 3 * third
    assert [c.balance_tokens for c in out] == [
        STARTING_CREDIT_TOKENS - third,
        STARTING_CREDIT_TOKENS - 100,
        STARTING_CREDIT_TOKENS - 2 * third,
        left_a,
        left_a,
        left_a - 1,
        1000,
        STARTING_CREDIT_TOKENS - 100,
    ]
    assert out[6].account_state == "created" and not out[6].key_revoked
    assert out[7].key_revoked and out[7].account_state == "verified"
    assert accounts.balance(a) == left_a - 1 == 0
    assert accounts.balance(b) == STARTING_CREDIT_TOKENS - 100
    assert accounts.balance(idle) == 1000
    charged = [e for e in accounts.ledger(a) if e["kind"] == "charge"]
    assert [e["request_id"] for e in charged] == ["req-0", "req-2", "req-3", "req-5"]
    assert [e["tokens"] for e in charged] == [-third, -third, -third, -1]
    month = month_of(datetime.now(UTC))
    rows = accounts.month_usage_rows()
    assert rows[(a, month, "metrics")] == (4, STARTING_CREDIT_TOKENS)
    assert rows[(b, month, "metrics")] == (1, 100)
    assert len(rows) == 2
    assert accounts.account_month(a, month)["usage"] == {
        "requests": 4,
        "tokens": STARTING_CREDIT_TOKENS,
        "by_route": {"metrics": {"requests": 4, "tokens": STARTING_CREDIT_TOKENS}},
    }


def test_usage_table_equals_the_ledger_after_concurrent_charges(accounts: Accounts) -> None:
    """Threads charging alone and in groups, and a charge writer serving an event loop, all
    at once on three accounts: nobody overspends, every accepted charge is one ledger row, and
    the usage table is exactly the ledger's charges grouped by account, month and route."""
    funded = [_funded(accounts, f"acc-{n}") for n in range(3)]
    cost = STARTING_CREDIT_TOKENS // 50  # each account affords exactly 50 calls
    routes = ("metrics", "heatmap", "returns")
    writer = ChargeWriter(accounts, idle_s=0.5)

    def alone(n: int) -> bool:
        account_id, key_id = funded[n % 3]
        request = _charge(account_id, key_id, cost, n, routes[n % 2])
        return accounts.charge_many([request])[0].ok

    def grouped(n: int) -> list[bool]:
        account_id, key_id = funded[n % 3]
        group = [_charge(account_id, key_id, cost, 1000 + 10 * n + k, "heatmap") for k in range(5)]
        return [c.ok for c in accounts.charge_many(group)]

    async def through_writer() -> list[bool]:
        calls = [
            writer.charge(_charge(*funded[n % 3], cost, 5000 + n, routes[n % 3])) for n in range(90)
        ]
        return [c.ok for c in await asyncio.gather(*calls)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        singles = pool.map(alone, range(60))
        groups = pool.map(grouped, range(12))
        via_writer = pool.submit(asyncio.run, through_writer())
        accepted = sum(singles) + sum(sum(g) for g in groups) + sum(via_writer.result())
    assert accepted == 150  # 3 accounts x 50, out of 60 + 60 + 90 attempts
    assert writer.charges == 90 and 1 <= writer.groups < 90
    for account_id, _ in funded:
        assert accounts.balance(account_id) == 0
        charges = [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]
        assert len(charges) == 50 and len({e["request_id"] for e in charges}) == 50
    table = accounts.month_usage_rows()
    assert table == accounts.ledger_month_totals()
    assert sum(requests for requests, _ in table.values()) == 150
    assert sum(tokens for _, tokens in table.values()) == 150 * cost


def test_the_writer_commits_a_loops_concurrent_charges_as_one_group(accounts: Accounts) -> None:
    account_id, key_id = _funded(accounts, "group")
    writer = ChargeWriter(accounts, idle_s=0.5)

    async def burst() -> list[bool]:
        calls = [writer.charge(_charge(account_id, key_id, 10, n)) for n in range(40)]
        return [c.ok for c in await asyncio.gather(*calls)]

    assert asyncio.run(burst()) == [True] * 40
    # The forty requests charged in one turn of the loop: one transaction, one commit.
    assert (writer.groups, writer.charges) == (1, 40)
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS - 400


def test_an_old_database_gets_its_usage_from_the_ledger_once(accounts: Accounts) -> None:
    """A database made before `monthly_usage` existed: charges in two months, no usage rows,
    no step recorded. Starting the server (make_engine) creates and fills the table from the
    ledger once; a second start leaves it alone."""
    account_id, key_id = _funded(accounts, "old")
    for n in range(3):
        accounts.charge(
            account_id, 7, key_id=key_id, route="metrics", params_digest="", request_id=str(n)
        )
    last_month = datetime.now(UTC).replace(day=1) - timedelta(days=2)
    with db.transaction(accounts.engine) as conn:
        conn.execute(
            insert(db.ledger).values(
                account_id=account_id,
                key_id=key_id,
                kind="charge",
                route="heatmap",
                tokens=-11,
                request_id="old",
                created_at=last_month,
            )
        )
        conn.execute(update(db.accounts).values(balance_tokens=db.accounts.c.balance_tokens - 11))
        conn.execute(delete(db.schema_steps))
    db.monthly_usage.drop(accounts.engine)
    url = accounts.engine.url
    home = Path(url.database).parent if url.drivername == "sqlite" else Path("/nonexistent")
    again = Accounts(db.make_engine(home, None if home.exists() else url.render_as_string(False)))
    this_month = month_of(datetime.now(UTC))
    assert again.month_usage_rows() == {
        (account_id, this_month, "metrics"): (3, 21),
        (account_id, month_of(last_month), "heatmap"): (1, 11),
    }
    assert again.month_usage_rows() == again.ledger_month_totals()
    assert db.fill_monthly_usage(again.engine) is False  # done once
    with again.engine.connect() as conn:
        steps = conn.execute(text("SELECT step FROM schema_steps")).scalars().all()
    assert steps == [db.USAGE_FILLED]
    assert again.account_month(account_id, this_month)["usage"]["tokens"] == 21


def test_the_key_cache_remembers_for_its_ttl_and_sees_local_changes_at_once(
    accounts: Accounts,
) -> None:
    account_id = accounts.create_account("cached")["account_id"]
    accounts.verify_card(account_id, provider="tests")
    made = accounts.create_key(account_id)
    key = made["key"]
    slow = KeyCache(accounts, ttl_s=600)
    assert slow.cached(key) is None  # nothing read yet
    record = slow.load(key)
    assert record is not None and slow.cached(key) == record
    # Revoked behind this process's back (as another process would): still remembered...
    with db.transaction(accounts.engine) as conn:
        conn.execute(
            update(db.api_keys)
            .where(db.api_keys.c.key_id == made["key_id"])
            .values(revoked_at=datetime.now(UTC))
        )
    assert slow.cached(key) == record
    # ...until a change made through this process's Accounts, which drops every entry.
    accounts.credit(account_id, 5, "not an access change")
    assert slow.cached(key) == record
    accounts.set_state(account_id, "suspended")
    assert slow.cached(key) is None
    assert slow.load(key) is None  # and a read sees the revocation
    # A short TTL: another key, revoked behind our back, is refused once the TTL has passed.
    other = accounts.create_key(account_id)
    accounts.set_state(account_id, "verified")
    quick = KeyCache(accounts, ttl_s=0.2)
    assert quick.load(other["key"]) is not None
    with db.transaction(accounts.engine) as conn:
        conn.execute(
            update(db.api_keys)
            .where(db.api_keys.c.key_id == other["key_id"])
            .values(revoked_at=datetime.now(UTC))
        )
    time.sleep(0.25)
    assert quick.cached(other["key"]) is None and quick.load(other["key"]) is None


def test_the_key_cache_tracks_the_balance_its_charges_leave() -> None:
    class Book:
        backend = Backend("database", is_outage=database_outage)

        def authenticate(self, key: str):
            from eqrisk.accounts.book import KeyRecord

            return KeyRecord("k", "a", "10/minute", False, "verified", 500)

    cache = KeyCache(Book(), ttl_s=600)  # type: ignore[arg-type]
    cache.note_balance("some-key", 1)  # not remembered: nothing to update
    assert cache.cached("some-key") is None
    cache.load("some-key")
    cache.note_balance("some-key", 250)
    record = cache.cached("some-key")
    assert record is not None and record.balance_tokens == 250 and record.account_id == "a"


def test_the_memory_window_counts_exactly_and_frees_requests_as_they_leave() -> None:
    window = MemoryWindow()
    t0 = time.time()
    outcomes = [window.hit("k", 5, 1) for _ in range(7)]
    assert [o[0] for o in outcomes] == [True] * 5 + [False] * 2
    assert [o[1] for o in outcomes] == [1, 2, 3, 4, 5, 5, 5]
    # The window frees a request when its oldest one leaves: one second after the first hit.
    assert t0 + 1 <= outcomes[-1][2] <= time.time() + 1
    assert window.hit("other", 5, 1)[:2] == (True, 1)  # keys count apart
    time.sleep(1.05)
    assert window.hit("k", 5, 1)[:2] == (True, 1)
