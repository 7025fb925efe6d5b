"""Failing backends fail soft (issue 21, item 3): a real `eqrisk serve --workers 2` reaches
PostgreSQL and Redis through TCP proxies that the test cuts (connections reset, new ones
refused) and pauses (a partition: bytes stop), one after the other, under a metered load.

Afterwards: no 5xx but 503, and every answer (503 or not) within the bound the timeouts give;
free Service A calls went on answering for the keys the workers knew; while Redis was down
nothing was refused for it; `/api/ready` said not ready while the database was down (and why),
ready with Redis down; `/api/health` answered 200 throughout; no traceback in the log; no charge
without a 2xx; balance = credits - ledger for every account."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy.engine import make_url

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.accounts.doubt import JOURNAL_DIR
from eqrisk.data.master import MAG7
from helpers import REDIS_URL, Server
from proxy import Proxy

pytestmark = pytest.mark.reliability

ACCOUNTS = 4
THREADS_PER_ACCOUNT = 2
TIMEOUT_S, CONNECT_S, REDIS_S, RETRY_S = 1.0, 2, 0.5, 0.5
ENV = {
    "EQRISK_DATABASE_TIMEOUT_S": str(TIMEOUT_S),
    "EQRISK_DATABASE_CONNECT_TIMEOUT_S": str(CONNECT_S),
    "EQRISK_REDIS_TIMEOUT_S": str(REDIS_S),
    "EQRISK_REDIS_CONNECT_TIMEOUT_S": str(REDIS_S),
    "EQRISK_BACKEND_RETRY_S": str(RETRY_S),
    "EQRISK_ACCESS_LOG": "false",
}
# The longest any answer may take (docs/decisions/outages.md): a key lookup and a charge, each
# at most a round trip and a connection attempt given up, plus a settlement's connection
# attempt; Redis's two timeouts; slack for a shared 2-core machine.
BOUND_S = 2 * (TIMEOUT_S + CONNECT_S) + CONNECT_S + 2 * REDIS_S + 1.5
PHASES = [  # (name, seconds, what to do to which proxy at its start)
    ("warm", 2.0, None),
    ("database cut", 2.5, ("db", "cut")),
    ("after cut", 2.0, ("db", "restore")),
    # Long enough for the first calls to give up (a round trip, then a connection attempt)
    # and the calls after them to be answered at once.
    ("database paused", 5.0, ("db", "pause")),
    ("after pause", 2.0, ("db", "resume")),
    ("redis cut", 2.0, ("redis", "cut")),
    ("redis paused", 2.0, ("redis", "restore+pause")),
    ("end", 2.0, ("redis", "resume")),
]
DATABASE_DOWN = {"database cut", "database paused"}
REDIS_DOWN = {"redis cut", "redis paused"}


@dataclass
class Outcome:
    request_id: str
    account: int
    free: bool
    phase: str  # the phase the request started in
    ended: str  # and the one it ended in
    status: int | None
    tokens: int
    seconds: float
    done_at: float  # monotonic time of the answer


def _calls(n: int) -> tuple[bool, str]:
    """(free, url) of the n-th call of a thread: priced Service B calls, free Service A ones."""
    stock = MAG7[n % len(MAG7)]
    if n % 3 == 2:
        return True, f"/daily?symbols={stock}&start_time=2026-06-01"
    if n % 3 == 1:
        return False, f"/api/ticker-returns?ticker={stock}&years=1"
    return False, f"/api/metrics/{stock}"


def test_backends_cut_and_paused_under_load(
    pg_database_url: str, served_home: Path, figures
) -> None:
    accounts = Accounts(make_engine(served_home, pg_database_url))
    funded = []
    for n in range(ACCOUNTS):
        account_id = accounts.create_account(f"outage-{n}")["account_id"]
        accounts.verify_card(account_id, provider="tests")
        funded.append((account_id, accounts.create_key(account_id, rate_limit="100000/minute")))
    direct = make_url(pg_database_url)
    redis_port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    outcomes: list[Outcome] = []
    ready: list[tuple[str, int, str, str]] = []  # (phase, status, database, redis)
    health: Counter[int | None] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    phase = ["start"]
    began: dict[str, float] = {}  # phase -> monotonic time it began

    def load(account: int, key: str, base: str) -> None:
        header = {"Authorization": f"Bearer {key}", "apikey": key}
        with httpx.Client(base_url=base, headers=header, timeout=30) as client:
            n = account
            while not stop.is_set():
                free, url = _calls(n)
                n += 1
                rid = f"outage-{uuid.uuid4().hex}"
                at, started = phase[0], time.monotonic()
                try:
                    resp = client.get(url, headers={"X-Request-ID": rid})
                except httpx.TransportError:
                    status, tokens = None, 0
                else:
                    status, tokens = resp.status_code, int(resp.headers.get("x-tokens-consumed", 0))
                    if status == 503:
                        assert resp.headers["content-type"] == "application/problem+json"
                        assert int(resp.headers["retry-after"]) >= 1
                        assert resp.json()["error"] == "SERVICE_UNAVAILABLE"
                took = time.monotonic() - started
                with lock:
                    outcomes.append(
                        Outcome(
                            rid, account, free, at, phase[0], status, tokens, took, started + took
                        )
                    )

    def probe(base: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                at = phase[0]
                resp = client.get("/api/ready")
                doc = resp.json()
                ready.append(
                    (at, resp.status_code, doc["database"]["state"], doc["redis"]["state"])
                )
                try:
                    health[client.get("/api/health").status_code] += 1
                except httpx.TransportError:
                    health[None] += 1
                time.sleep(0.2)

    with Proxy(direct.port or 5432) as db, Proxy(redis_port) as redis:
        env = {
            **ENV,
            "EQRISK_DATABASE_URL": direct.set(port=db.port).render_as_string(hide_password=False),
            "EQRISK_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
        }
        proxies = {"db": db, "redis": redis}
        with Server(served_home, workers=2, **env) as server:
            threads = [
                threading.Thread(target=load, args=(n, key["key"], server.base))
                for n, (_, key) in enumerate(funded)
                for _ in range(THREADS_PER_ACCOUNT)
            ]
            threads.append(threading.Thread(target=probe, args=(server.base,)))
            for thread in threads:
                thread.start()
            # The clock starts once every client has had its first answers (the workers have
            # seen each key, whatever the machine's load).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    answered = Counter(o.account for o in outcomes if o.status == 200)
                if len(answered) == ACCOUNTS and min(answered.values()) >= 3 * THREADS_PER_ACCOUNT:
                    break
                time.sleep(0.1)
            phase[0] = "warm"
            for name, seconds, action in PHASES:
                began[name] = time.monotonic()
                phase[0] = (
                    name  # before the proxies change: a later answer is not counted as before
                )
                if action is not None:
                    which, what = action
                    for step in what.split("+"):
                        getattr(proxies[which], step)()
                time.sleep(seconds)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            # Groups answered 503 while their outcome could not be asked are settled once
            # the database answers again: their records leave the journal.
            journal = served_home / JOURNAL_DIR
            deadline = time.monotonic() + 20
            while list(journal.glob("*.json")) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not list(journal.glob("*.json")), "groups in doubt were never settled"
            final = httpx.get(f"{server.base}/api/ready", timeout=30)
            assert final.status_code == 200, final.text
            log = server.log()

    statuses = Counter(o.status for o in outcomes)
    assert set(statuses) <= {200, 503}, statuses  # no 5xx but 503, no lost connection
    slowest = max(o.seconds for o in outcomes)
    assert slowest <= BOUND_S, f"an answer took {slowest:.1f}s (bound {BOUND_S:.1f}s)"
    by_phase: dict[str, Counter[str]] = {
        name: Counter() for name in ["start"] + [p for p, _, _ in PHASES]
    }
    for o in outcomes:
        kind = "free" if o.free else "priced"
        by_phase[o.phase][f"{kind} {o.status}"] += 1
    for name in DATABASE_DOWN:
        assert by_phase[name]["free 200"] > 0, (name, by_phase[name])  # known keys go on
        assert by_phase[name]["priced 503"] > 0, (name, by_phase[name])
    for name in REDIS_DOWN:  # limits are counted per process: nothing refused for Redis
        assert by_phase[name]["priced 503"] == by_phase[name]["free 503"] == 0, by_phase[name]
    for name in ("warm", "end"):  # all backends up from start to end of the request
        steady = Counter(o.status for o in outcomes if o.phase == o.ended == name)
        downs = [line for line in log.splitlines() if " down: " in line]
        assert set(steady) == {200}, (name, steady, downs[:3])
    assert set(health) == {200}, health
    seen = {(at, status, database) for at, status, database, _ in ready}
    assert any(at in DATABASE_DOWN and s == 503 and d == "down" for at, s, d in seen), ready
    assert any(at in REDIS_DOWN and s == 200 and r == "down" for at, s, _, r in ready), ready
    assert "Traceback" not in log, log[-3000:]
    assert "503 database unavailable" in log

    rows_total = 0
    charged = {o.request_id: o for o in outcomes if o.status == 200 and o.tokens > 0}
    for n, (account_id, _) in enumerate(funded):
        ledger = accounts.ledger(account_id)
        credits = sum(e["tokens"] for e in ledger if e["tokens"] > 0)
        charges = -sum(e["tokens"] for e in ledger if e["tokens"] < 0)
        assert accounts.balance(account_id) == credits - charges >= 0
        rows = {e["request_id"]: -e["tokens"] for e in ledger if e["kind"] == "charge"}
        mine = {rid: o.tokens for rid, o in charged.items() if o.account == n}
        assert rows == mine, "a charge without a 2xx, or a 2xx without its charge"
        rows_total += len(rows)
    assert accounts.month_usage_rows() == accounts.ledger_month_totals()

    def p(values: list[float], q: float) -> float:
        return round(float(np.percentile(values, q)), 2) if values else 0.0

    # How long after a backend came back 503s were still answered (the `backend_retry_s`
    # during which a failed backend is not tried again).
    recovered = max(
        (
            o.done_at - began[o.ended]
            for o in outcomes
            if o.status == 503 and o.ended.startswith("after")
        ),
        default=0.0,
    )
    settled = [line for line in log.splitlines() if "settled: " in line and "taken back" in line]
    taken_back = sum(int(line.split("settled: ")[1].split()[0]) for line in settled)
    figures(
        requests=len(outcomes),
        statuses=dict(sorted((str(s), c) for s, c in statuses.items())),
        by_phase={k: dict(sorted(v.items())) for k, v in by_phase.items()},
        slowest_s=round(slowest, 2),
        bound_s=BOUND_S,
        p50_s=p([o.seconds for o in outcomes], 50),
        p99_503_s=p([o.seconds for o in outcomes if o.status == 503], 99),
        last_503_after_recovery_s=round(recovered, 2),
        ledger_rows=rows_total,
        groups_settled_later=len(settled),
        charges_taken_back=taken_back,
        not_ready_probes=sum(1 for _, s, _, _ in ready if s == 503),
        health_probes=sum(health.values()),
        load=os.getloadavg()[0],
    )
