"""`eqrisk bench cost`: what a call costs the server next to what it costs the caller: the
server's CPU seconds per USD charged, per route, at each route's worst case (largest body, most
tickers, most unknown tickers, longest range), and the CPU of the free calls (estimates, 404s,
the demo key's); then `/api/health`'s latency alone and with four worst-case portfolio and
estimate calls running at once. The demo key's cases stay within its 5 calls a minute.

The server is a real `eqrisk serve` (one worker) over a demo market built for the bench in a
temporary home; its CPU is read from /proc (user + system, every thread) before and after each
case's calls, so a case's figure is all the server did for it: parsing, planning, pricing,
rendering, the ledger. Each case runs once to warm (caches, compiled kernels), then `repeats`
times sequentially, more for a cheap case (`measure`); the figure is the mean per call.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from eqrisk.api.endpoints.batch_analyze import SERIES_YEARS_PER_TICKER
from eqrisk.bench.serve import _bench_server, _server_cpu_s, prepare_home

DEMO_KEY = "eqrisk-demo"
MIN_CPU_S = 0.2  # server CPU a case's timed calls reach (20 ticks of /proc: ±5%)...
MORE = 20  # ...within this many times the run's calls


@dataclass(frozen=True)
class Case:
    route: str
    case: str
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    demo: bool = False
    repeats: int | None = None  # None: the run's
    encoding: str | None = None  # Accept-Encoding; None: httpx's (gzip, deflate, br, zstd)
    # The path's `{ticker}` is each of these in turn: every call a new answer, neither rendered
    # nor compressed before (a caller going through the market pays for no cache).
    rotate: tuple[str, ...] = ()


def cases(tickers: list[str], etfs: list[str], live: list[str] | None = None) -> list[Case]:
    """Each route's ordinary call and its worst cases, on the demo market's tickers; `live`:
    the stocks still traded (a forecast on the last session), which the calls that walk the
    market name in turn (a delisted one has no last year: a free 404)."""
    stocks = [t for t in tickers if t not in etfs]
    alive = set(stocks if live is None else live)
    walk = tuple(t for t in stocks if t in alive)
    rng = np.random.default_rng(3)
    known = stocks[: min(len(stocks), 5000)]
    pad = [f"ZZ{i:05d}" for i in range(5000 - len(known))]
    big = dict(zip([*known, *pad], rng.normal(0, 1e-3, 5000).tolist(), strict=True))
    bench = dict(zip([*pad, *known], rng.uniform(0, 4e-4, 5000).tolist(), strict=True))
    unknown = {f"ZZ{i:05d}": 1e-3 for i in range(4999)}
    one_known = {**unknown, "NVDA": 1e-3}
    ordinary = {"positions": {"NVDA": 0.5, "AAPL": 0.3, "MSFT": 0.2}, "benchmark": "SPY"}
    # The batch's worst case within its cap (api/endpoints/batch_analyze.py): 100 tickers of
    # returns over SERIES_YEARS_PER_TICKER years; one ticker over 15 years is charged the minimum.
    years = SERIES_YEARS_PER_TICKER
    batch = {"tickers": stocks[:100], "metrics": ["full_metrics", "returns"], "years": years}
    one = {"tickers": stocks[:1], "metrics": ["full_metrics", "returns"], "years": 15}
    return [
        Case("portfolio/risk", "3 positions, SPY", "POST", "/api/portfolio/risk", ordinary),
        Case(
            "portfolio/risk",
            "5,000 positions, 5,000-position benchmark",
            "POST",
            "/api/portfolio/risk",
            {"positions": big, "benchmark": bench},
        ),
        Case(
            "portfolio/risk",
            "4,999 unknown + 1 known",
            "POST",
            "/api/portfolio/risk",
            {"positions": one_known, "benchmark": {k: 1e-3 for k in one_known}},
        ),
        Case(
            "portfolio/risk",
            "5,000 unknown (404, free)",
            "POST",
            "/api/portfolio/risk",
            {"positions": {**unknown, "ZZ99999": 1.0}},
        ),
        Case(
            "estimate",
            "of the 5,000/5,000 book (free)",
            "POST",
            "/api/estimate",
            {"endpoint": "portfolio/risk", "params": {"positions": big, "benchmark": bench}},
        ),
        Case("metrics", "NVDA", "GET", "/api/metrics/NVDA"),
        Case("ticker-returns", "NVDA, 15 years", "GET", "/api/ticker-returns?ticker=NVDA&years=15"),
        Case(
            "ticker-returns",
            "NVDA, 15 years, Parquet",
            "GET",
            "/api/ticker-returns?ticker=NVDA&years=15&format=parquet&nocache=true",
        ),
        *(
            Case(
                "ticker-returns",
                f"a new stock each call, {n} year{'s' * (n > 1)}{label}",
                "GET",
                f"/api/ticker-returns?ticker={{ticker}}&years={n}{query}",
                rotate=walk,
            )
            for n in (1, 15)
            for label, query in (("", ""), (", Parquet", "&format=parquet"))
        ),
        Case("batch/analyze", f"100 tickers, {years} years", "POST", "/api/batch/analyze", batch),
        Case(
            "batch/analyze",
            f"100 tickers, {years} years, br only",
            "POST",
            "/api/batch/analyze",
            batch,
            encoding="br",
        ),
        Case("batch/analyze", "1 ticker, 15 years", "POST", "/api/batch/analyze", one),
        Case("specific-risk", "every row, JSON", "GET", "/api/specific-risk"),
        Case("factor-covariance", "latest", "GET", "/api/factor-covariance"),
        Case("metrics", "demo key (free)", "GET", "/api/metrics/AAPL", demo=True, repeats=2),
        Case(
            "portfolio/risk",
            "demo key, 3 positions, SPY (free)",
            "POST",
            "/api/portfolio/risk",
            ordinary,
            demo=True,
            repeats=1,
        ),
    ]


def _call(client: httpx.Client, base: str, case: Case, key: str) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {DEMO_KEY if case.demo else key}"}
    if case.encoding is not None:
        headers["Accept-Encoding"] = case.encoding
    path = case.path
    if case.rotate:
        turn = _TURNS[id(case)] = _TURNS.get(id(case), -1) + 1
        path = path.format(ticker=case.rotate[turn % len(case.rotate)])
    if case.json is None:
        response = client.request(case.method, base + path, headers=headers)
    else:  # the body encoded once per case: the client's own JSON work is not what is timed
        headers["Content-Type"] = "application/json"
        response = client.request(case.method, base + path, content=_body(case), headers=headers)
    return response.status_code, float(response.headers.get("x-api-cost-usd") or 0.0)


_BODIES: dict[int, bytes] = {}
_TURNS: dict[int, int] = {}  # a rotating case's last ticker


def _body(case: Case) -> bytes:
    body = _BODIES.get(id(case))
    if body is None:
        body = _BODIES[id(case)] = orjson.dumps(case.json)
    return body


def measure(base: str, pid: int, key: str, case: Case, repeats: int) -> dict[str, Any]:
    """One case: warmed once, then `repeats` calls, and more (up to `MORE` times as many)
    until the server has used `MIN_CPU_S` for them: /proc counts CPU in ticks of 10 ms, so ten
    calls of 1.5 ms read as 1 or 2 ms each, which moved the paid cases' median by half. CPU
    and USD per call, and the median time from sending the request to the whole answer
    received (the client on the same machine). A case with its own `repeats` (the demo key's,
    within its 5 calls a minute) makes just those."""
    n = case.repeats or repeats
    most = n if case.repeats else n * MORE
    with httpx.Client(timeout=120) as client:
        _call(client, base, case, key)
        cpu0 = _server_cpu_s(pid)
        statuses, usd = set(), 0.0
        walls: list[float] = []
        while len(walls) < n or (len(walls) < most and _server_cpu_s(pid) - cpu0 < MIN_CPU_S):
            t0 = time.perf_counter()
            status, cost = _call(client, base, case, key)
            walls.append(time.perf_counter() - t0)
            statuses.add(status)
            usd += cost
        n = len(walls)
        cpu = (_server_cpu_s(pid) - cpu0) / n
    usd /= n
    return {
        "route": case.route,
        "case": case.case,
        "status": ",".join(str(s) for s in sorted(statuses)),
        "usd": usd,
        "cpu_ms": cpu * 1e3,
        "wall_ms": statistics.median(walls) * 1e3,
        "cpu_s_per_usd": cpu / usd if usd > 0 else None,
    }


def _load_loop(base: str, case: Case, key: str, stop: Any, made: Any) -> None:
    """One load: `case` called in a loop until `stop` is set (in a process of its own)."""
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            _call(client, base, case, key)
            with made.get_lock():
                made.value += 1


def health_latency(base: str, seconds: float, load: list[Case], key: str) -> dict[str, float]:
    """Sequential /api/health calls for `seconds`, with each case of `load` called in a loop
    by a process of its own meanwhile (the load's client work does not hold this process's
    interpreter lock): p50, p99 and max in ms, and the load calls made."""
    ctx = multiprocessing.get_context("fork")  # no thread runs here at this point
    stop, made = ctx.Event(), ctx.Value("l", 0)
    procs = [ctx.Process(target=_load_loop, args=(base, c, key, stop, made)) for c in load]
    for p in procs:
        p.start()
    times = []
    with httpx.Client(timeout=30) as client:
        if load:  # every load process started and calling before the clock runs
            deadline = time.monotonic() + 60
            while made.value < len(load) and time.monotonic() < deadline:
                time.sleep(0.05)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            client.get(f"{base}/api/health").raise_for_status()
            times.append((time.perf_counter() - t0) * 1e3)
    stop.set()
    for p in procs:
        p.join(timeout=120)
    lat = np.array(times)
    return {
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "calls": len(times),
        "load_calls": int(made.value),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paid cases' CPU-s per USD (median, worst and their ratio) and the free calls'
    largest CPU."""
    paid = [r for r in rows if r["cpu_s_per_usd"] is not None]
    free = [r for r in rows if r["cpu_s_per_usd"] is None]
    per_usd = [r["cpu_s_per_usd"] for r in paid]
    median = statistics.median(per_usd) if per_usd else 0.0
    worst = max(paid, key=lambda r: r["cpu_s_per_usd"]) if paid else None
    heaviest_free = max(free, key=lambda r: r["cpu_ms"]) if free else None
    return {
        "median_cpu_s_per_usd": median,
        "worst_cpu_s_per_usd": worst["cpu_s_per_usd"] if worst else 0.0,
        "worst_case": f"{worst['route']}: {worst['case']}" if worst else "",
        "worst_over_median": worst["cpu_s_per_usd"] / median if worst and median else 0.0,
        "max_free_cpu_ms": heaviest_free["cpu_ms"] if heaviest_free else 0.0,
        "max_free_case": (
            f"{heaviest_free['route']}: {heaviest_free['case']}" if heaviest_free else ""
        ),
    }


def run(
    *, repeats: int = 10, seconds: float = 5.0, say: Callable[[str], None] = print
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-cost-") as tmp:
        home = Path(tmp)
        key = prepare_home(home, say)
        with _bench_server(home) as (base, pid):
            rows = httpx.get(
                f"{base}/api/specific-risk", headers={"Authorization": f"Bearer {key}"}, timeout=60
            ).json()["data"]
            tickers = [r["ticker"] for r in rows]
            etfs = sorted(
                {r[f"{s}_factor"] for r in rows for s in ("market", "sector", "subsector")} - {None}
            )
            live = [r["ticker"] for r in rows if r.get("risk_total_vol") is not None]
            all_cases = cases(tickers, etfs, live)
            results = []
            for case in all_cases:
                say(f"{case.route}: {case.case}")
                results.append(measure(base, pid, key, case, repeats))
            say("/api/health alone, then with 4 worst-case portfolio and estimate calls")
            alone = health_latency(base, seconds, [], key)
            heavy = [all_cases[1], all_cases[2], all_cases[4], all_cases[3]]
            loaded = health_latency(base, seconds, heavy, key)
            final_cpu = _server_cpu_s(pid)
    return {
        "routes": results,
        "summary": summary(results),
        "health_alone": alone,
        "health_under_load": loaded,
        "server_cpu_s": final_cpu,
    }
