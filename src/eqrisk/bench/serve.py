"""`eqrisk bench serve`: throughput and latency of the data routes next to the server's own
floor (`/api/health`), on one server, with one load generator, in one run.

The server is a real `eqrisk serve` process over a 16-year demo market built for the bench in a
temporary home. The load generator is wrk when it is installed (Debian package `wrk`), else a
small asyncio + httpx client; either way every target gets the same generator and settings, so
the ratios are meaningful even where absolute numbers are not.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from eqrisk.bench.served import eqrisk_serve

if TYPE_CHECKING:  # with httpx2 installed (the mcp SDK's), its client is httpx2's, not httpx's
    from starlette.testclient import TestClient

BENCH_START = "2010-01-04"

LARGE_LEDGER_ROWS = 100_000
BALANCE_CALLS = 300  # sequential /api/balance calls per account for the latency comparison


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    headers: dict[str, str]


def prepare_home(home: Path, say: Callable[[str], None]) -> str:
    """Demo market from 2010 (so 15-year answers exist), built, plus a verified key with a
    limit high enough not to interfere. Returns the key."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine
    from eqrisk.build.demo import build_demo

    say("generating, ingesting and building a 16-year demo market")
    build_demo(home, start=BENCH_START)
    accounts = Accounts(make_engine(home))
    account = accounts.create_account("bench")["account_id"]
    accounts.verify_card(account, provider="bench")
    accounts.credit(account, 10**12, "bench credit")
    return accounts.create_key(account, rate_limit="100000000/minute")["key"]


def _wrk(url: str, headers: dict[str, str], seconds: float, connections: int) -> dict[str, float]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    text = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    if non2xx:
        raise RuntimeError(f"{url}: {non2xx.group(1)} error responses under load")

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        assert m, text
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    return {"rps": rps, "p50_ms": pct("50"), "p99_ms": pct("99")}


async def _httpx_load(
    url: str, headers: dict[str, str], seconds: float, connections: int
) -> dict[str, float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:
        # The clock starts once the client exists, and every connection sends at least one
        # request: on a loaded machine a short load could otherwise end before any was sent.
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            first = True
            while first or time.perf_counter() < stop:
                first = False
                t0 = time.perf_counter()
                r = await client.get(url)
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1e3
    return {
        "rps": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


def _load_server(
    home: Path,
    key: str,
    cache_mb: int,
    seconds: float,
    connections: int,
    use_wrk: bool,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    env = {**os.environ, "EQRISK_HOME": str(home), "EQRISK_RENDER_CACHE_MB": str(cache_mb)}
    env.pop("EQRISK_REDIS_URL", None)
    cache = "on" if cache_mb else "off"
    results = []
    with eqrisk_serve(env) as server:
        base = server.base
        for target in _targets(base, key):
            url = base + target.path
            check = httpx.get(url, headers=target.headers, timeout=30)
            check.raise_for_status()
            say(f"render cache {cache}: {target.name} ({len(check.content) / 1e3:.0f} kB)")
            if use_wrk:
                stats = _wrk(url, target.headers, seconds, connections)
            else:
                stats = asyncio.run(_httpx_load(url, target.headers, seconds, connections))
            results.append(
                {"target": target.name, "cache": cache, "bytes": len(check.content), **stats}
            )
        if not cache_mb:
            say("render cache off: /api/health while 8 connections fetch large answers")
            results.append(_health_under_load(base, key, seconds, use_wrk))
    return results


def _targets(base: str, key: str, client: httpx.Client | TestClient | None = None) -> list[Target]:
    get = client.get if client is not None else httpx.get
    b = {"Authorization": f"Bearer {key}"}
    a = {"apikey": key}
    top = get(f"{base}/symbol_list?top_n=10&top_by=mktcap", headers=a).json()["symbols"]
    symbols = ",".join(top)
    latest = get(f"{base}/api/health").json()["data_as_of"]
    start = str(int(latest[:4]) - 10) + latest[4:]
    return [
        Target("health", "/api/health", {}),
        Target("ticker-returns 15y json", "/api/ticker-returns?ticker=NVDA&years=15", b),
        Target(
            "ticker-returns 15y parquet",
            "/api/ticker-returns?ticker=NVDA&years=15&format=parquet",
            b,
        ),
        Target("daily 10 symbols x 10y json", f"/daily?symbols={symbols}&start_time={start}", a),
        Target(
            "daily 10 symbols x 10y csv",
            f"/daily?symbols={symbols}&start_time={start}&format=csv",
            a,
        ),
    ]


def run(
    *,
    seconds: float = 5.0,
    connections: int = 8,
    generator: str = "auto",
    ledger_rows: int = LARGE_LEDGER_ROWS,
    balance_calls: int = BALANCE_CALLS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    use_wrk = generator == "wrk" or (generator == "auto" and shutil.which("wrk") is not None)
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-") as tmp:
        home = Path(tmp)
        key = prepare_home(home, say)
        say("writing the large answers in-process: the writers next to orjson")
        writers = writer_speeds(home, key, repeats=3 if seconds < 2 else 15)
        results = []
        # Once with the per-process render cache off (every answer rendered), once on.
        for cache_mb in (0, 256):
            results += _load_server(home, key, cache_mb, seconds, connections, use_wrk, say)
        metered = measure_metered(
            home,
            seconds=seconds,
            ledger_rows=ledger_rows,
            balance_calls=balance_calls,
            generator=generator,
            say=say,
        )

    scenario = [r for r in results if r["target"] == LOADED_HEALTH]
    results = [r for r in results if r["target"] != LOADED_HEALTH]
    for row in results:
        row["mb_per_s"] = row["bytes"] * row["rps"] / 1e6
        floor = next(
            r["rps"] for r in results if r["cache"] == row["cache"] and r["target"] == "health"
        )
        row["rps_ratio_to_health"] = row["rps"] / floor
    return {
        "generator": "wrk" if use_wrk else "httpx-asyncio",
        "seconds_per_target": seconds,
        "connections": connections,
        "server": "eqrisk serve, 1 worker (uvicorn)",
        "results": results,
        "health_under_large_answers": scenario[0],
        "writers": writers,
        "metered": metered,
    }


# ------------------------------------------------------------------------------ metered path
# Issue 9: every paid request is authenticated, counted against its key's limit, charged (a
# transaction with its ledger row and the month's usage) and answered. Measured with ordinary
# verified, funded accounts (not a free or operator key), next to /api/health at the same
# concurrency on the same server, and `/api/balance` on a new account next to one whose ledger
# holds `ledger_rows` charges.

METERED_CONNECTIONS = 16


@dataclass(frozen=True)
class MeteredKeys:
    """Keys of three ordinary accounts (verified card, so the starting credit), limits high
    enough that the limiter counts every request but refuses none during a run."""

    metered: str  # funded for the load: charged for every answer
    new_account: str  # a handful of ledger rows
    large_ledger: str  # `ledger_rows` charges in its ledger, all this month
    metered_account: str
    large_account: str
    ledger_rows: int


def prepare_metered(home: Path, ledger_rows: int, say: Callable[[str], None]) -> MeteredKeys:
    """The bench's accounts in `home`'s accounts database; the large ledger is written by the
    charge itself (`charge_many`, in groups), so its usage rows are the real ones."""
    from eqrisk.accounts.book import Accounts, ChargeRequest
    from eqrisk.accounts.db import make_engine

    accounts = Accounts(make_engine(home))

    def account(name: str, credit: int) -> tuple[str, str, str]:
        account_id = accounts.create_account(name)["account_id"]
        accounts.verify_card(account_id, provider="bench")
        if credit:
            accounts.credit(account_id, credit, "bench credit")
        made = accounts.create_key(account_id, rate_limit="100000000/minute")
        return account_id, made["key"], made["key_id"]

    metered_id, metered, _ = account("bench metered", 10**10)
    _, new, _ = account("bench new account", 0)
    large_id, large, large_key_id = account("bench large ledger", ledger_rows)
    say(f"writing {ledger_rows:,} charges into one account's ledger")
    for start in range(0, ledger_rows, 1000):
        group = [
            ChargeRequest(large_id, 1, large_key_id, "metrics", "bench", f"bench-{n}")
            for n in range(start, min(start + 1000, ledger_rows))
        ]
        assert all(c.ok for c in accounts.charge_many(group))
    return MeteredKeys(metered, new, large, metered_id, large_id, ledger_rows)


def _server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _bench_server(home: Path, pricing_file: Path | None = None) -> Iterator[tuple[str, int]]:
    """`eqrisk serve` (one worker, the embedded database, in-memory limits) over `home`:
    yields its base URL and process id, stops it on exit."""
    env = {**os.environ, "EQRISK_HOME": str(home)}
    for name in ("EQRISK_REDIS_URL", "EQRISK_DATABASE_URL", "EQRISK_PRICING_FILE"):
        env.pop(name, None)
    if pricing_file is not None:
        env["EQRISK_PRICING_FILE"] = str(pricing_file)
    with eqrisk_serve(env) as server:
        yield server.base, server.proc.pid


def _balance_latency(base: str, key: str, calls: int) -> dict[str, float]:
    """Sequential `/api/balance` calls on one connection: p50 and p99 in ms."""
    times = []
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        for _ in range(calls):
            t0 = time.perf_counter()
            client.get(f"{base}/api/balance").raise_for_status()
            times.append((time.perf_counter() - t0) * 1e3)
    lat = np.array(times)
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def measure_metered(
    home: Path,
    *,
    seconds: float = 5.0,
    ledger_rows: int = LARGE_LEDGER_ROWS,
    balance_calls: int = BALANCE_CALLS,
    connections: int = METERED_CONNECTIONS,
    generator: str = "auto",
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The metered figures on a home with a built snapshot: req/s, p50/p99 and the server's
    CPU per request of /api/health, /api/metrics/NVDA (metered key) and /api/balance (the
    large ledger's key), each with its ratio to health; then /api/balance's latency on a new
    account next to the large ledger; and the money checked afterwards (every answered charge
    is one ledger row, the usage table equals the ledger)."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine

    use_wrk = generator == "wrk" or (generator == "auto" and shutil.which("wrk") is not None)
    keys = prepare_metered(home, ledger_rows, say)
    accounts = Accounts(make_engine(home))
    before = accounts.balance(keys.metered_account)

    def load(base: str, pid: int, name: str, path: str, key: str | None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        httpx.get(base + path, headers=headers, timeout=30).raise_for_status()
        say(f"metered path: {name}, {connections} connections")
        cpu0 = _server_cpu_s(pid)
        if use_wrk:
            stats = _wrk(base + path, headers, seconds, connections)
        else:
            stats = asyncio.run(_httpx_load(base + path, headers, seconds, connections))
        cpu = _server_cpu_s(pid) - cpu0
        per_request = cpu / (stats["rps"] * seconds) * 1e6
        return {"target": name, **stats, "server_cpu_us_per_request": per_request}

    wal = home / "accounts.db-wal"  # SQLite's WAL: checkpointed beside the charge writer
    with _bench_server(home) as (base, pid):
        rows = [
            load(base, pid, "health", "/api/health", None),
            load(base, pid, "metrics/NVDA, metered key", "/api/metrics/NVDA", keys.metered),
        ]
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        rows.append(load(base, pid, "balance, large-ledger key", "/api/balance", keys.large_ledger))
        say(f"/api/balance latency: new account vs {ledger_rows:,} ledger rows")
        new = _balance_latency(base, keys.new_account, balance_calls)
        large = _balance_latency(base, keys.large_ledger, balance_calls)
        usage = httpx.get(
            f"{base}/api/balance", headers={"Authorization": f"Bearer {keys.large_ledger}"}
        ).json()["usage_this_month"]
    # The same call on a server where it is free (the key is still looked up and counted):
    # what the route costs without its charge, so the charge's own share is visible.
    unpriced_file = home / "bench-unpriced-prices.json"
    unpriced_file.write_text(json.dumps({"metrics": {"usd": 0}}))
    with _bench_server(home, unpriced_file) as (base, pid):
        unpriced = [
            load(base, pid, "health (unpriced server)", "/api/health", None),
            load(base, pid, "metrics/NVDA, same key, price 0", "/api/metrics/NVDA", keys.metered),
        ]
    for group in (rows, unpriced):
        for row in group:
            row["rps_ratio_to_health"] = row["rps"] / group[0]["rps"]
    charges = [e for e in accounts.ledger(keys.metered_account) if e["kind"] == "charge"]
    spent = before - accounts.balance(keys.metered_account)
    return {
        "generator": "wrk" if use_wrk else "httpx-asyncio",
        "connections": connections,
        "seconds_per_target": seconds,
        "results": rows,
        "unpriced": unpriced,
        "charge_cpu_us_per_request": rows[1]["server_cpu_us_per_request"]
        - unpriced[1]["server_cpu_us_per_request"],
        "balance_latency": {
            "ledger_rows": ledger_rows,
            "new_account": new,
            "large_ledger": large,
            "p50_ratio_large_to_new": large["p50_ms"] / new["p50_ms"],
        },
        "checks": {
            "metered_charges": len(charges),
            "metered_tokens_spent": spent,
            "ledger_tokens_charged": -sum(e["tokens"] for e in charges),
            "large_ledger_usage_requests": usage["requests"],
            "usage_table_equals_ledger": accounts.month_usage_rows()
            == accounts.ledger_month_totals(),
            # The WAL file's size after the metered load: its largest extent, as SQLite reuses
            # it from the start after each full checkpoint (accounts/checkpoint.py).
            "wal_mb_after_metered_load": wal_bytes / 1e6,
        },
    }


# --------------------------------------------------------------------------- large answers

LOADED_HEALTH = "health while 8 connections fetch large answers"
LARGE_ANSWERS = ("ticker-returns 15y json", "daily 10 symbols x 10y json")


def _large(target: Target) -> bool:
    """The large answers of the targets: 15 years of ticker returns, 10 symbols x 10 years."""
    return target.name.startswith(("ticker-returns 15y", "daily 10 symbols x 10y"))


def writer_speeds(home: Path, key: str, repeats: int) -> list[dict[str, Any]]:
    """The large JSON targets' rows, written in-process by each writer and by orjson, in a
    process whose allocator is set as `eqrisk serve`'s (`keep_freed_memory`): the writers
    as the server runs them (pyarrow keeps its own memory pool either way)."""
    from fastapi.testclient import TestClient

    from eqrisk.api.app import create_app, keep_freed_memory
    from eqrisk.bench import render
    from eqrisk.settings import Settings

    keep_freed_memory()
    settings = Settings(home=home, _env_file=None)
    with TestClient(create_app(settings)) as client:
        targets = {t.name: t for t in _targets("", key, client)}
    wanted = [(n, targets[n].path, targets[n].headers) for n in LARGE_ANSWERS]
    return [render.measure(answer, repeats) for answer in render.capture(home, wanted)]


def _wrk_mix(base: str, targets: list[Target], seconds: float, connections: int) -> Any:
    """wrk cycling through the targets' paths, every request with every target's headers."""
    headers = {k: v for t in targets for k, v in t.headers.items()}
    script = "paths = {" + ",".join(f'"{t.path}"' for t in targets) + "}\ni = 0\n"
    script += "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    script += (
        'request = function()\n  i = i % #paths + 1\n  return wrk.format("GET", paths[i])\nend\n'
    )
    lua = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115
    lua.write(script)
    lua.close()
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", lua.name, base + "/"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _httpx_mix(base: str, targets: list[Target], seconds: float, connections: int) -> None:
    """The httpx stand-in for `_wrk_mix`, run in a child process (`multiprocessing`)."""

    async def main() -> None:
        stop = time.perf_counter() + seconds
        async with httpx.AsyncClient(timeout=60) as client:

            async def worker(k: int) -> None:
                while time.perf_counter() < stop:
                    t = targets[k % len(targets)]
                    k += 1
                    (await client.get(base + t.path, headers=t.headers)).raise_for_status()

            await asyncio.gather(*(worker(k) for k in range(connections)))

    asyncio.run(main())


def _health_under_load(base: str, key: str, seconds: float, use_wrk: bool) -> dict[str, Any]:
    """/api/health answered one after another (5 ms apart) while 8 other connections fetch
    the large answers (JSON, CSV, Parquet) round robin: what a large answer costs the small
    ones. The load runs in another process, so the probe's own client never waits on it."""
    import multiprocessing

    connections = 8
    large = [t for t in _targets(base, key) if _large(t)]
    load_seconds = seconds + 1.0
    if use_wrk:
        load: Any = _wrk_mix(base, large, load_seconds, connections)
    else:
        load = multiprocessing.get_context("spawn").Process(
            target=_httpx_mix, args=(base, large, load_seconds, connections)
        )
        load.start()
    time.sleep(0.5)  # the load under way
    latencies: list[float] = []
    with httpx.Client(timeout=30) as client:
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            client.get(base + "/api/health").raise_for_status()
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.005)
    out: dict[str, Any] = {"target": LOADED_HEALTH, "cache": "off", "bytes": 0}
    if use_wrk:
        text = load.communicate(timeout=60)[0]
        if re.search(r"Non-2xx or 3xx responses", text):
            raise RuntimeError(f"error responses among the large answers: {text}")
        rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
        out["large_answers_rps"] = float(rps.group(1)) if rps else float("nan")
    else:
        load.join(timeout=60)
        if load.exitcode != 0:
            raise RuntimeError(f"the httpx load ended with exit code {load.exitcode}")
    lat = np.array(latencies) * 1e3
    out.update(
        {
            "rps": len(lat) / seconds,
            "probes": len(lat),
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()),
            "connections_fetching_large_answers": connections,
            "large_answers": [t.name for t in large],
        }
    )
    return out
