"""Issue 37, connections: eqrisk behind a real PgBouncer in transaction pool mode (Debian's
`pgbouncer`, started here on a free port in front of the machine's PostgreSQL), and pool sizes
as settings.

The fleet check: two `eqrisk serve --workers 2` through PgBouncer with 20 server connections,
under a metered load from many threads: every answer 200, no connection error in any log, the
tokens the answers say they charged equal the ledger's charges and each balance's fall, and
PostgreSQL never saw more than the pool's 20 connections (the 40-worker run is
`eqrisk bench pgbouncer`, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from eqrisk.accounts.audit import differences
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import Pool, Timeouts, make_engine
from eqrisk.accounts.pricing import DEFAULT_PRICES
from eqrisk.bench.pooler import PgBouncer, available
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings
from helpers import Server, bearer

pytestmark = pytest.mark.skipif(not available(), reason="pgbouncer is not installed")

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POOL = 20  # PgBouncer's server connections
WORKERS = 2  # per server
THREADS = 8


@pytest.fixture()
def database() -> Iterator[str]:
    """A database of this test's own, so that PostgreSQL's count of its connections is ours."""
    name = f"eqrisk_pgb_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"PostgreSQL is not reachable: {exc}")
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture()
def bouncer(tmp_path: Path) -> Iterator[PgBouncer]:
    with PgBouncer(tmp_path / "pgbouncer", pool_size=POOL) as running:
        yield running


def server_connections(database_url: str) -> int:
    """Connections PostgreSQL holds open to the database (this one not counted)."""
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test") as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_pool_sizes_are_settings() -> None:
    settings = Settings(
        database_pool_size=3, database_max_overflow=1, database_pooler="pgbouncer", _env_file=None
    )
    assert Pool.of(settings) == Pool(3, 1, True)
    assert Pool.of(Settings(_env_file=None)) == Pool(5, 10, False)
    with pytest.raises(ValueError, match="database_pool_size"):
        Settings(database_pool_size=0, _env_file=None)
    with pytest.raises(ValueError, match="database_pooler"):
        Settings(database_pooler="pgpool", _env_file=None)


def test_an_engine_has_the_pool_it_is_given(database: str, tmp_path: Path) -> None:
    timeouts = Timeouts(connect_s=2, io_s=0.2)  # also the wait for a free pooled connection
    engine = make_engine(tmp_path, database, timeouts=timeouts, pool=Pool(2, 1))
    held = [engine.connect() for _ in range(3)]  # two pooled, one overflow
    assert engine.pool.checkedout() == 3  # type: ignore[attr-defined]
    with pytest.raises(PoolTimeout):  # a fourth waits for a free one, then gives up
        engine.connect()
    for conn in held:
        conn.close()
    assert engine.pool.checkedin() == 2  # type: ignore[attr-defined]  # the overflow one closed
    engine.dispose()


def test_behind_pgbouncer_only_the_pooler_setting_connects(
    database: str, bouncer: PgBouncer, tmp_path: Path
) -> None:
    """Connection options (the server timeouts) are refused by PgBouncer; with the pooler
    setting, the same statements many times over on many connections work (a prepared
    statement would be looked for on another server connection and be missing)."""
    url = bouncer.url_for(database)
    timeouts = Timeouts(connect_s=3, io_s=5.0)
    with pytest.raises(OperationalError, match="unsupported startup parameter"):
        make_engine(tmp_path, url, timeouts=timeouts)
    engine = make_engine(tmp_path, url, timeouts=timeouts, pool=Pool(4, 4, pgbouncer=True))
    accounts = Accounts(engine)
    account_id = accounts.create_account("bounced")["account_id"]
    accounts.verify_card(account_id, provider="tests")

    def read(_: int) -> int:
        return accounts.balance(account_id)

    with ThreadPoolExecutor(8) as pool:
        balances = list(pool.map(read, range(400)))
    assert balances == [STARTING_CREDIT_TOKENS] * 400
    # The server's timeouts come from PgBouncer's connect_query, as documented.
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5s"
    engine.dispose()
    assert "prepared statement" not in bouncer.log()


def test_two_servers_of_two_workers_through_pgbouncer_charge_exactly(
    database: str, bouncer: PgBouncer, demo_home: Path, tmp_path: Path
) -> None:
    direct = Accounts(make_engine(tmp_path / "admin", database))
    keys: list[tuple[str, str]] = []
    for n in range(8):
        account_id = direct.create_account(f"fleet-{n}")["account_id"]
        direct.verify_card(account_id, provider="tests")
        keys.append((account_id, direct.create_key(account_id, rate_limit="100000/minute")["key"]))
    direct.engine.dispose()

    env = {
        "EQRISK_SNAPSHOTS": str(demo_home / "snapshots"),
        "EQRISK_DATABASE_URL": bouncer.url_for(database),
        "EQRISK_DATABASE_POOLER": "pgbouncer",
        "EQRISK_DATABASE_POOL_SIZE": "3",
        "EQRISK_DATABASE_MAX_OVERFLOW": "5",
        "EQRISK_ACCESS_LOG": "false",
    }
    for host in ("host-1", "host-2"):
        (tmp_path / host).mkdir()
    per_thread = 20
    charged: dict[str, int] = {account_id: 0 for account_id, _ in keys}
    statuses: list[int] = []
    peak = [0]
    lock = threading.Lock()
    done = threading.Event()
    # Both start at once (each waits for its own health check as it is entered).
    starting = [Server(tmp_path / h, workers=WORKERS, **env) for h in ("host-1", "host-2")]
    try:
        with starting[0] as one, starting[1] as two:
            assert len(one.workers()) == len(two.workers()) == WORKERS

            def watch() -> None:
                while not done.is_set():
                    seen = server_connections(database)
                    with lock:
                        peak[0] = max(peak[0], seen)
                    done.wait(0.05)

            def load(n: int) -> None:
                account_id, key = keys[n % len(keys)]
                base = (one, two)[n % 2].base
                with httpx.Client(base_url=base, headers=bearer(key), timeout=60) as client:
                    for i in range(per_thread):
                        route = f"/api/metrics/{MAG7[(n + i) % len(MAG7)]}"
                        if i % 5 == 4:
                            route = "/api/balance"
                        resp = client.get(route)
                        with lock:
                            statuses.append(resp.status_code)
                            charged[account_id] += int(resp.headers.get("x-tokens-consumed", "0"))

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                with ThreadPoolExecutor(THREADS) as pool:
                    list(pool.map(load, range(THREADS)))
            finally:
                done.set()
                watcher.join()
            logs = one.log() + two.log()
    finally:  # one that did not start is not left running
        for server in starting:
            if server.proc.poll() is None:
                server.proc.kill()

    assert statuses == [200] * (THREADS * per_thread), sorted(set(statuses))
    for needle in ("Traceback", "OperationalError", "prepared statement", "unsupported startup"):
        assert needle not in logs, logs[-3000:]
    assert 0 < peak[0] <= POOL  # 4 workers x (3 + 5) could open 32: PgBouncer keeps 20

    check = Accounts(make_engine(tmp_path / "admin", database))
    metered = DEFAULT_PRICES["metrics"].tokens
    assert sum(charged.values()) == THREADS * per_thread * 4 // 5 * metered  # /api/balance is free
    for account_id, tokens in charged.items():
        spent = -sum(r["tokens"] for r in check.ledger(account_id) if r["kind"] == "charge")
        assert spent == tokens
        assert check.balance(account_id) == STARTING_CREDIT_TOKENS - tokens
    assert differences(check.engine) == []
    check.engine.dispose()


def test_config_check_goes_through_pgbouncer_as_the_servers_do(
    database: str, bouncer: PgBouncer, tmp_path: Path
) -> None:
    from eqrisk.cli.check import check_database

    url = bouncer.url_for(database)
    through = Settings(home=tmp_path, database_url=url, database_pooler="pgbouncer", _env_file=None)
    line = check_database(through)
    assert (
        line.startswith("PgBouncer postgresql+psycopg://postgres@127.0.0.1:")
        and "connected" in line
    )
    direct_options = Settings(home=tmp_path, database_url=url, _env_file=None)
    with pytest.raises(RuntimeError, match="unsupported startup parameter: options"):
        check_database(direct_options)
