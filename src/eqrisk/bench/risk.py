"""`eqrisk bench risk`: a portfolio's risk through the factor structure (`portfolio_risk`:
volatility, Euler contributions per position, factor and level, the hedge) next to what a numpy
user writes with a dense N x N covariance, on the same data, in one run, with the answers
compared:

- `dense`: Sigma = H F H' + diag(D) of the positions built as an N x N matrix, then w'Sigma w
  and the contributions w * Sigma w / vol: the same model, so the same answer to rounding;
- `dense_given`: the same products with Sigma already built (a user who keeps it);
- `sample`: np.cov of the positions' last 252 daily returns, then the same products: the
  covariance a user computes from returns alone (its answer differs by its estimation error).

and `route`: what `POST /api/portfolio/risk` computes on a cached model day
(`snapshot.portfolio.risk_and_hedge`: the risk, the ETF hedge and the hedged book's risk).

The universe is synthetic, with both layers of the served model: 11 sectors, 20 subsectors over
one market (like the ETF hierarchy of the real data) and the second layer's style factors (the
residual market, exposure 1, and six standardised styles); factor returns give F
(`covariance.factor_covariance`), each stock has hedge ratios on its three ETF factors, style
exposures and a specific variance, and its returns are drawn from that model. Each way is timed
as the fastest of its repeats, the ways taking turns (`render.best_of`).

`http` (not with --quick): the route over HTTP, one `eqrisk serve` over a synthetic market
of `http_symbols` symbols (SPY, the 11 sector ETFs and over 5,000 stocks, `bench.daily`'s data
set) and `http_sessions` sessions, built in a temporary home by `eqrisk build` (both layers, as
every build): books of that many stocks the model knows, long and short; per call the server's
CPU (/proc, every thread: parsing, pricing, the answer, its compression) and the wall time of
the call from a client on the same machine, the answer compressed as the client asks (httpx
with zstandard installed: zstd). The data set is short in sessions (the style factors with a
forecast are those its history allows) so that it builds in a minute or two.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.bench.render import best_of
from eqrisk.model.covariance import CovarianceParams, factor_covariance
from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import STYLE_LEVEL, RiskModelDay
from eqrisk.model.styles import StyleParams
from eqrisk.snapshot.portfolio import risk_and_hedge

SECTORS, SUBSECTORS = 11, 20
HISTORY = 252
STYLES = StyleParams().factor_names  # the residual market and six styles


@dataclass(frozen=True)
class RiskBench:
    sizes: tuple[int, ...] = (500, 5000)
    repeats: int = 30
    seed: int = 0
    http: bool = True  # the route over HTTP too (a synthetic market is built: minutes)
    http_symbols: int = 5100  # SPY, 11 sector ETFs and 5,088 stocks
    http_sessions: int = 450


QUICK = RiskBench(sizes=(50, 300), repeats=3, http=False)


def synthetic_day(n: int, seed: int = 0) -> tuple[RiskModelDay, np.ndarray]:
    """A model session of n stocks and the last HISTORY daily returns drawn from it (n x H)."""
    rng = np.random.default_rng(seed)
    t = 3 * HISTORY
    m = rng.standard_t(5, t) * 0.01
    sec = 0.9 * m + rng.normal(0, 0.006, (SECTORS, t))
    sub = (
        0.5 * m + 0.6 * sec[np.arange(SUBSECTORS) % SECTORS] + rng.normal(0, 0.008, (SUBSECTORS, t))
    )
    styles = rng.normal(0, 0.002, (len(STYLES), t))
    factors = np.vstack([m, sec, sub, styles])
    cov = factor_covariance(factors, CovarianceParams()).cov[-1]
    keys = ["SPY"] + [f"SEC{j}" for j in range(SECTORS)] + [f"SUB{j}" for j in range(SUBSECTORS)]
    keys += STYLES
    level = np.array([1] + [2] * SECTORS + [3] * SUBSECTORS + [STYLE_LEVEL] * len(STYLES))
    sub_of = rng.integers(0, SUBSECTORS, n)
    index = np.column_stack(
        [np.zeros(n, dtype=np.int64), 1 + sub_of % SECTORS, 1 + SECTORS + sub_of]
    )
    values = np.column_stack(
        [rng.uniform(-0.2, 0.6, n), rng.uniform(0.2, 1.0, n), rng.uniform(0.0, 0.8, n)]
    )
    specific = rng.uniform(0.01, 0.03, n) ** 2
    style = np.column_stack([np.ones(n), rng.normal(0.0, 1.0, (n, len(STYLES) - 1))])
    day = RiskModelDay(
        session=0,
        symbols=np.array([f"S{i:05d}" for i in range(n)]),
        factor_keys=keys,
        factor_level=level,
        cov=cov,
        index=index,
        values=values,
        level=np.full(n, 3),
        specific_var=specific,
        style=style,
    )
    exposure = np.zeros((n, len(keys)))
    for j in range(3):
        exposure[np.arange(n), index[:, j]] += values[:, j]
    exposure[:, day.n_etf :] = style
    recent = factors[:, -HISTORY:]
    returns = exposure @ recent + rng.normal(0, 1, (n, HISTORY)) * np.sqrt(specific)[:, None]
    return day, returns


def dense_sigma(day: RiskModelDay, rows: np.ndarray) -> np.ndarray:
    """H F H' + diag(D) of `rows`, N x N, as a numpy user writes it."""
    h = np.zeros((len(rows), len(day.factor_keys)))
    for j in range(3):
        h[np.arange(len(rows)), day.index[rows, j]] += day.values[rows, j]
    if day.style is not None:
        h[:, day.n_etf :] = day.style[rows]
    sigma: np.ndarray = h @ day.cov @ h.T
    sigma[np.diag_indices_from(sigma)] += day.specific_var[rows]
    return sigma


def dense_risk(sigma: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """Volatility and per-position Euler contributions from a dense covariance."""
    sw = sigma @ w
    vol = float(np.sqrt(w @ sw))
    return vol, w * sw / vol


def measure(n: int, b: RiskBench) -> dict[str, Any]:
    """One portfolio of n positions (long and short) through each way."""
    day, returns = synthetic_day(n, b.seed)
    rng = np.random.default_rng(b.seed + 1)
    w = rng.normal(0.0, 1.0, n) / n
    positions = dict(zip(day.symbols.tolist(), w.tolist(), strict=True))
    rows = np.arange(n)
    kept = dense_sigma(day, rows)

    def ours() -> tuple[float, np.ndarray]:
        risk = portfolio_risk(day, positions).portfolio
        return risk.vol, risk.positions.contribution

    def route() -> tuple[float, np.ndarray]:
        risk, hedge = risk_and_hedge(day, day, positions, None, 3)
        return hedge.vol_after, risk.portfolio.positions.contribution

    def dense() -> tuple[float, np.ndarray]:
        return dense_risk(dense_sigma(day, rows), w)

    def sample() -> tuple[float, np.ndarray]:
        return dense_risk(np.cov(returns), w)

    ways = {
        "eqrisk": ours,
        "route": route,
        "dense": dense,
        "dense_given": lambda: dense_risk(kept, w),
        "sample": sample,
    }
    load = os.getloadavg()[0]
    best = best_of(ways, b.repeats if n <= 1000 else max(3, b.repeats // 5))
    vol, contrib = best["eqrisk"][1]
    d_vol, d_contrib = best["dense"][1]
    s_vol = best["sample"][1][0]
    ms = {way: seconds * 1e3 for way, (seconds, _) in best.items()}
    return {
        "positions": n,
        "eqrisk_ms": round(ms["eqrisk"], 3),
        "route_ms": round(ms["route"], 3),
        "dense_ms": round(ms["dense"], 3),
        "dense_given_ms": round(ms["dense_given"], 3),
        "sample_cov_ms": round(ms["sample"], 3),
        "dense_over_eqrisk": round(ms["dense"] / ms["eqrisk"], 1),
        "dense_given_over_eqrisk": round(ms["dense_given"] / ms["eqrisk"], 2),
        "sample_cov_over_eqrisk": round(ms["sample"] / ms["eqrisk"], 1),
        "vol_rel_diff_dense": float(abs(vol - d_vol) / d_vol),
        "contribution_max_diff_dense": float(np.max(np.abs(contrib - d_contrib))),
        "route_contribution_max_diff": float(np.max(np.abs(best["route"][1][1] - contrib))),
        "vol_rel_diff_sample_cov": round(float(abs(vol - s_vol) / vol), 4),
        "load_average_1m": round(load, 2),
    }


def run(b: RiskBench, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Each size in turn; the figures of each, keyed by its number of positions."""
    synthetic_day(10)  # warm what a first call compiles or caches
    result: dict[str, Any] = {"cpus": os.cpu_count()}
    for n in b.sizes:
        say(f"portfolio risk of {n} positions: eqrisk, route, dense, sample covariance ...")
        for key, value in measure(n, b).items():
            result[f"{n}_{key}"] = value
    if b.http:
        calls = max(9, b.repeats)  # in thirds: /proc counts CPU in 10 ms ticks
        for key, value in over_http(b.sizes, calls, say, b.http_symbols, b.http_sessions).items():
            result[f"http_{key}"] = value
    return result


def prepare_synthetic_home(
    home: Path, symbols: int, sessions: int, say: Callable[[str], Any]
) -> str:
    """A home with `bench.daily`'s synthetic data set of `symbols` x `sessions` ingested and
    built (the risk model's both layers) and a verified key with a limit high enough not to
    interfere. Returns the key."""
    from eqrisk.accounts.book import Accounts
    from eqrisk.accounts.db import make_engine
    from eqrisk.bench.daily import write_data_set
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.model.run import ModelParams

    say(f"writing a synthetic market of {symbols:,} symbols x {sessions} sessions, building it")
    write_data_set(home, symbols, sessions, 0, None)
    build_snapshot(home, ModelParams(), market_etf="SPY")
    accounts = Accounts(make_engine(home))
    account = accounts.create_account("bench")["account_id"]
    accounts.verify_card(account, provider="bench")
    accounts.credit(account, 10**12, "bench credit")
    key: str = accounts.create_key(account, rate_limit="100000000/minute")["key"]
    return key


def over_http(
    sizes: tuple[int, ...],
    repeats: int,
    say: Callable[[str], Any] = print,
    symbols: int = RiskBench.http_symbols,
    sessions: int = RiskBench.http_sessions,
) -> dict[str, Any]:
    """`POST /api/portfolio/risk` on one `eqrisk serve` over a synthetic market of `symbols`
    (`prepare_synthetic_home`): per size, a book of that many stocks the model knows; the
    server's CPU per call (mean of `repeats` calls after one to warm, and of each third of
    them: the spread), the fastest and the median wall time, the positions used and the
    answer's factors of each layer."""
    import statistics
    import tempfile
    import time

    import httpx
    import orjson

    from eqrisk.bench.serve import _bench_server, _server_cpu_s

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="eqrisk-bench-risk-") as tmp:
        key = prepare_synthetic_home(Path(tmp), symbols, sessions, say)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with _bench_server(Path(tmp)) as (base, pid), httpx.Client(timeout=120) as client:
            rows = client.get(f"{base}/api/specific-risk", headers=headers).json()["data"]
            etfs = {r[f"{s}_factor"] for r in rows for s in ("market", "sector", "subsector")}
            known = [
                r["ticker"]
                for r in rows
                if r["risk_total_vol"] is not None and r["ticker"] not in etfs
            ]
            out["universe_stocks"] = len(known)
            rng = np.random.default_rng(1)
            for n in sizes:
                if n > len(known):
                    raise RuntimeError(f"the synthetic market holds {len(known)} stocks, not {n}")
                say(f"POST /api/portfolio/risk, {n} positions, over HTTP")
                w = rng.normal(0.0, 1.0, n) / n
                body = orjson.dumps({"positions": dict(zip(known[:n], w.tolist(), strict=True))})
                post = f"{base}/api/portfolio/risk"
                answer = client.post(post, content=body, headers=headers)
                answer.raise_for_status()
                doc = answer.json()
                cpus, walls = [], []
                for _ in range(3):
                    cpu0 = _server_cpu_s(pid)
                    for _ in range(max(1, repeats // 3)):
                        t0 = time.perf_counter()
                        client.post(post, content=body, headers=headers).raise_for_status()
                        walls.append(time.perf_counter() - t0)
                    cpus.append((_server_cpu_s(pid) - cpu0) / max(1, repeats // 3))
                levels = [f["level"] for f in doc["portfolio"]["factors"]]
                out[f"{n}_known"] = len(doc["portfolio"]["positions"])
                out[f"{n}_etf_factors"] = sum(lv != "style" for lv in levels)
                out[f"{n}_style_factors"] = levels.count("style")
                out[f"{n}_answer_kb"] = round(len(answer.content) / 1e3, 1)
                out[f"{n}_server_cpu_ms"] = round(statistics.fmean(cpus) * 1e3, 2)
                out[f"{n}_server_cpu_ms_thirds"] = [round(c * 1e3, 1) for c in cpus]
                out[f"{n}_wall_ms"] = round(min(walls) * 1e3, 2)
                out[f"{n}_wall_median_ms"] = round(statistics.median(walls) * 1e3, 2)
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    return out
