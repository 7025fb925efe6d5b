"""`eqrisk bench serve`: throughput and latency of the data routes next to the server's own
floor (`/api/health`), on one server, with one load generator, in one run.

The server is a real `eqrisk serve` process over a 16-year demo market built for the bench in a
temporary home. The load generator is wrk when it is installed (Debian package `wrk`), else a
small asyncio + httpx client; either way every target gets the same generator and settings, so
the ratios are meaningful even where absolute numbers are not.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

BENCH_START = "2010-01-04"


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
    from eqrisk.snapshot.build import build_demo

    say("generating, ingesting and building a 16-year demo market")
    build_demo(home, start=BENCH_START)
    accounts = Accounts(make_engine(home))
    account = accounts.create_account("bench")["account_id"]
    accounts.verify_card(account, provider="bench")
    accounts.credit(account, 10**12, "bench credit")
    return accounts.create_key(account, rate_limit="100000000/minute")["key"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the bench server exited before it was ready")
        try:
            if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the bench server did not become ready")


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
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:

        async def worker() -> None:
            while time.perf_counter() < stop:
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
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "EQRISK_HOME": str(home), "EQRISK_RENDER_CACHE_MB": str(cache_mb)}
    env.pop("EQRISK_REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqrisk.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cache = "on" if cache_mb else "off"
    results = []
    try:
        _wait_ready(base, proc)
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
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return results


def _targets(base: str, key: str) -> list[Target]:
    b = {"Authorization": f"Bearer {key}"}
    a = {"apikey": key}
    top = httpx.get(f"{base}/symbol_list?top_n=10&top_by=mktcap", headers=a).json()["symbols"]
    symbols = ",".join(top)
    latest = httpx.get(f"{base}/api/health").json()["data_as_of"]
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
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    use_wrk = generator == "wrk" or (generator == "auto" and shutil.which("wrk") is not None)
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-") as tmp:
        home = Path(tmp)
        key = prepare_home(home, say)
        results = []
        # Once with the per-process render cache off (every answer rendered), once on.
        for cache_mb in (0, 256):
            results += _load_server(home, key, cache_mb, seconds, connections, use_wrk, say)
    for row in results:
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
    }
