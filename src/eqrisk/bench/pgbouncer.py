"""`eqrisk bench pgbouncer`: one `eqrisk serve --workers N` on PostgreSQL through PgBouncer
(transaction mode, a pool of 20 server connections), next to the same server connected
directly, in one run.

Each phase starts the server on a demo market built for the bench, sends a paid load
(`/api/metrics/<ticker>`, metered) from many connections for some seconds, and checks what the
issue asks: no connection error (every answer 200, no database error in the server's log), the
tokens the answers say they charged equal the ledger's charges and each balance's fall (and
the whole database reconciles, as `eqrisk accounts reconcile` checks it), with p50 and p99 of
both phases and their ratio. The database is the bench's own (created on the server, dropped at
the end); PostgreSQL's connections to it are counted while the load runs.

Both phases give every worker the same pool (`database_pool_size` 1 + `database_max_overflow`
1: the charge writer's connection and one for key look-ups), so that the direct phase stays
within PostgreSQL's default 100 connections at 40 workers; PgBouncer is the only difference.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
from sqlalchemy import create_engine, make_url, text

from eqrisk.bench.pooler import PgBouncer, available
from eqrisk.bench.served import eqrisk_serve
from eqrisk.data.master import MAG7

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ACCOUNTS = 8  # per phase
PER_WORKER = (1, 1)  # database_pool_size, database_max_overflow
LOG_ERRORS = (
    "Traceback",
    "OperationalError",
    "TimeoutError",
    "too many clients",
    "prepared statement",
    "unsupported startup",
)
TICKERS = tuple(MAG7)  # in the demo market


@dataclass(frozen=True)
class PgBouncerBench:
    workers: int = 40
    pool: int = 20
    connections: int = 80
    seconds: float = 20.0
    warmup_s: float = 3.0
    admin_url: str = ADMIN_URL


QUICK = PgBouncerBench(workers=4, connections=8, seconds=1.5, warmup_s=0.5)


@contextmanager
def own_database(admin_url: str) -> Iterator[str]:
    """A database of the bench's own on the server of `admin_url`, dropped at the end."""
    name = f"eqrisk_bench_pgb_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _libpq(url: str) -> str:
    u = make_url(url)
    parts = {"host": u.host, "port": u.port, "user": u.username, "dbname": u.database}
    if u.password:
        parts["password"] = u.password
    return " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)


class ConnectionWatch:
    """PostgreSQL's connections to one database, polled every 50 ms while the block runs."""

    def __init__(self, admin_url: str, database: str) -> None:
        self._dsn = _libpq(admin_url)
        self._name = database
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._done.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self._name,)
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)
                self._done.wait(0.05)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def free_slots(admin_url: str) -> int:
    """Connections PostgreSQL would still accept from ordinary users."""
    with psycopg.connect(_libpq(admin_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    return int(row[0]) if row else 0


def make_keys(database_url: str, home: Path, phase: str) -> list[tuple[str, str, int]]:
    """`ACCOUNTS` verified, funded accounts with a key each: (account, key, balance)."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine

    accounts = Accounts(make_engine(home, database_url))
    made = []
    for n in range(ACCOUNTS):
        account_id = accounts.create_account(f"bench-{phase}-{n}")["account_id"]
        accounts.verify_card(account_id, provider="bench")
        accounts.credit(account_id, 10**12, "bench credit")
        key = accounts.create_key(account_id, rate_limit="100000000/minute")["key"]
        made.append((account_id, key, accounts.balance(account_id)))
    accounts.engine.dispose()
    return made


async def _load(
    base: str, keys: list[tuple[str, str, int]], connections: int, seconds: float
) -> dict[str, Any]:
    """Metered calls from `connections` clients for `seconds`: latencies of the 200s, other
    statuses and transport errors counted, tokens charged per account from the answers."""
    latencies: list[float] = []
    failures: dict[str, int] = {}
    charged = {account: 0 for account, _, _ in keys}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        stop = time.perf_counter() + seconds

        async def caller(n: int) -> None:
            account, key, _ = keys[n % len(keys)]
            headers = {"Authorization": f"Bearer {key}"}
            i = 0
            while i == 0 or time.perf_counter() < stop:
                route = f"/api/metrics/{TICKERS[(n + i) % len(TICKERS)]}"
                i += 1
                t0 = time.perf_counter()
                try:
                    resp = await client.get(route, headers=headers)
                except httpx.HTTPError as exc:
                    failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                    continue
                if resp.status_code != 200:
                    failures[str(resp.status_code)] = failures.get(str(resp.status_code), 0) + 1
                else:
                    latencies.append(time.perf_counter() - t0)
                charged[account] += int(resp.headers.get("x-tokens-consumed", "0"))

        await asyncio.gather(*(caller(n) for n in range(connections)))
    return {"latencies": latencies, "failures": failures, "charged": charged}


def _workers_up(pid: int) -> int:
    """uvicorn's worker processes under the serve process (spawned children)."""
    found = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found += 1
            except OSError:
                continue
    return found


def _pss_mb(pid: int) -> float:
    """Proportional memory of `pid` and its children, MB (shared pages split between them)."""
    total = 0
    pids = [str(pid)]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += (task / "children").read_text().split()
        except OSError:
            continue
    for p in set(pids):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_phase(
    bench: PgBouncerBench,
    phase: str,
    home: Path,
    database: str,
    served_url: str,
    pgbouncer: bool,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """One server of `bench.workers` workers on `served_url`, under the paid load; the figures
    and checks of the phase."""
    from eqrisk.accounts.db import make_engine

    keys = make_keys(database, home / "admin", phase)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    env.update(
        EQRISK_HOME=str(home),
        EQRISK_DATABASE_URL=served_url,
        EQRISK_DATABASE_POOLER="pgbouncer" if pgbouncer else "none",
        EQRISK_DATABASE_POOL_SIZE=str(PER_WORKER[0]),
        EQRISK_DATABASE_MAX_OVERFLOW=str(PER_WORKER[1]),
        EQRISK_ACCESS_LOG="false",
        EQRISK_METRICS="off",
    )
    with tempfile.TemporaryFile() as log_file:

        def log() -> str:
            fd = log_file.fileno()
            return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

        say(f"{phase}: starting eqrisk serve --workers {bench.workers}")
        started = time.perf_counter()
        with eqrisk_serve(
            env, "--workers", str(bench.workers), wait_s=900, stderr=log_file, log=log
        ) as server:
            base = server.base
            while _workers_up(server.proc.pid) < bench.workers:  # all, not just the first
                if time.perf_counter() - started > 900:
                    raise RuntimeError(f"{phase}: not every worker started in 900 s")
                time.sleep(0.5)
            start_s = time.perf_counter() - started
            say(f"{phase}: {bench.workers} workers up in {start_s:.0f}s; warming up")
            warm = asyncio.run(_load(base, keys, bench.connections, bench.warmup_s))
            say(f"{phase}: {bench.connections} connections for {bench.seconds:g}s")
            load = os.getloadavg()[0]
            with ConnectionWatch(bench.admin_url, make_url(database).database or "") as watch:
                t0 = time.perf_counter()
                timed = asyncio.run(_load(base, keys, bench.connections, bench.seconds))
                elapsed = time.perf_counter() - t0
            pss = _pss_mb(server.proc.pid)
        logged = log()

    engine = make_engine(home / "admin", database)
    check = _ledger_check(engine, keys, warm["charged"], timed["charged"])
    engine.dispose()
    failures = dict(warm["failures"])
    for name, count in timed["failures"].items():
        failures[name] = failures.get(name, 0) + count
    lat = np.array(timed["latencies"]) * 1e3
    return {
        "phase": phase,
        "workers": bench.workers,
        "start_s": round(start_s, 1),
        "load_average_1m": round(load, 2),
        "requests": len(lat),
        "rps": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "failed_requests": sum(failures.values()),
        "failures": failures,
        "log_errors": sum(logged.count(needle) for needle in LOG_ERRORS),
        "peak_server_connections": watch.peak,
        "server_pss_mb": round(pss),
        **check,
    }


def _ledger_check(
    engine: Any,
    keys: list[tuple[str, str, int]],
    *charged: dict[str, int],
) -> dict[str, Any]:
    """The answers' tokens against the ledger, per account, and the database reconciled."""
    from eqrisk.accounts.audit import differences, usage_differences
    from eqrisk.accounts.book import Accounts

    accounts = Accounts(engine)
    answered = ledger = 0
    balances_fell_by_charges = True
    for account_id, _, before in keys:
        tokens = sum(c[account_id] for c in charged)
        spent = -sum(r["tokens"] for r in accounts.ledger(account_id) if r["kind"] == "charge")
        answered += tokens
        ledger += spent
        balances_fell_by_charges &= accounts.balance(account_id) == before - spent
    return {
        "charged_tokens_answered": answered,
        "charged_tokens_ledger": ledger,
        "credits_equal_ledger": answered == ledger
        and balances_fell_by_charges
        and not differences(engine)
        and not usage_differences(engine),
    }


def run(bench: PgBouncerBench, say: Callable[[str], None]) -> dict[str, Any]:
    from eqrisk.build.demo import build_demo

    if not available():
        raise RuntimeError("pgbouncer is not installed (Debian package `pgbouncer`)")
    needed = bench.workers * sum(PER_WORKER) + 5
    if (free := free_slots(bench.admin_url)) < needed:
        raise RuntimeError(
            f"PostgreSQL accepts {free} more connections; the direct phase may open {needed}: "
            "use fewer --workers"
        )
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-pgb-") as tmp:
        home = Path(tmp) / "home"
        say("building the demo market")
        build_demo(home)
        with own_database(bench.admin_url) as database:
            with PgBouncer(Path(tmp) / "pgbouncer", pool_size=bench.pool) as bouncer:
                through = run_phase(
                    bench, "pgbouncer", home, database, bouncer.url_for(database), True, say
                )
                bouncer_log = bouncer.log()
            direct = run_phase(bench, "direct", home, database, database, False, say)
    p99 = (through["p99_ms"] or 0) / (direct["p99_ms"] or float("inf"))
    return {
        "workers": bench.workers,
        "pgbouncer_pool": bench.pool,
        "per_worker_pool": f"{PER_WORKER[0]} + {PER_WORKER[1]} overflow",
        "connections": bench.connections,
        "seconds": bench.seconds,
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "phases": [through, direct],
        "connection_errors": through["failed_requests"] + through["log_errors"],
        "pgbouncer_log_errors": sum(
            bouncer_log.count(n) for n in ("ERROR", "closing because: server conn crashed")
        ),
        "credits_equal_ledger": bool(
            through["credits_equal_ledger"] and direct["credits_equal_ledger"]
        ),
        "p50_ratio_pgbouncer_to_direct": (through["p50_ms"] or 0) / (direct["p50_ms"] or 1),
        "p99_ratio_pgbouncer_to_direct": p99,
        "p99_within_2x": p99 <= 2.0,
        "postgres_connections_within_pool": through["peak_server_connections"] <= bench.pool,
    }
