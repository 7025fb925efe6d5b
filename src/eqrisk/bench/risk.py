"""`eqrisk bench risk`: a portfolio's risk through the factor structure (`portfolio_risk`:
volatility, Euler contributions per position, factor and level, the hedge) next to what a numpy
user writes with a dense N x N covariance, on the same data, in one run, with the answers
compared:

- `dense`: Sigma = H F H' + diag(D) of the positions built as an N x N matrix, then w'Sigma w
  and the contributions w * Sigma w / vol: the same model, so the same answer to rounding;
- `dense_given`: the same products with Sigma already built (a user who keeps it);
- `sample`: np.cov of the positions' last 252 daily returns, then the same products: the
  covariance a user computes from returns alone (its answer differs by its estimation error).

The universe is synthetic (11 sectors, 20 subsectors over one market, like the ETF hierarchy of
the real data): factor returns give F (`covariance.factor_covariance`), each stock has hedge
ratios on its three factors and a specific variance, and its returns are drawn from that model.
Each way is timed as the fastest of its repeats, the ways taking turns (`render.best_of`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqrisk.bench.render import best_of
from eqrisk.model.covariance import CovarianceParams, factor_covariance
from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import RiskModelDay

SECTORS, SUBSECTORS = 11, 20
HISTORY = 252


@dataclass(frozen=True)
class RiskBench:
    sizes: tuple[int, ...] = (500, 5000)
    repeats: int = 30
    seed: int = 0


QUICK = RiskBench(sizes=(50, 300), repeats=3)


def synthetic_day(n: int, seed: int = 0) -> tuple[RiskModelDay, np.ndarray]:
    """A model session of n stocks and the last HISTORY daily returns drawn from it (n x H)."""
    rng = np.random.default_rng(seed)
    t = 3 * HISTORY
    m = rng.standard_t(5, t) * 0.01
    sec = 0.9 * m + rng.normal(0, 0.006, (SECTORS, t))
    sub = (
        0.5 * m + 0.6 * sec[np.arange(SUBSECTORS) % SECTORS] + rng.normal(0, 0.008, (SUBSECTORS, t))
    )
    factors = np.vstack([m, sec, sub])
    cov = factor_covariance(factors, CovarianceParams()).cov[-1]
    keys = ["SPY"] + [f"SEC{j}" for j in range(SECTORS)] + [f"SUB{j}" for j in range(SUBSECTORS)]
    level = np.array([1] + [2] * SECTORS + [3] * SUBSECTORS)
    sub_of = rng.integers(0, SUBSECTORS, n)
    index = np.column_stack(
        [np.zeros(n, dtype=np.int64), 1 + sub_of % SECTORS, 1 + SECTORS + sub_of]
    )
    values = np.column_stack(
        [rng.uniform(-0.2, 0.6, n), rng.uniform(0.2, 1.0, n), rng.uniform(0.0, 0.8, n)]
    )
    specific = rng.uniform(0.01, 0.03, n) ** 2
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
    )
    exposure = np.zeros((n, len(keys)))
    for j in range(3):
        exposure[np.arange(n), index[:, j]] += values[:, j]
    recent = factors[:, -HISTORY:]
    returns = exposure @ recent + rng.normal(0, 1, (n, HISTORY)) * np.sqrt(specific)[:, None]
    return day, returns


def dense_sigma(day: RiskModelDay, rows: np.ndarray) -> np.ndarray:
    """H F H' + diag(D) of `rows`, N x N, as a numpy user writes it."""
    h = np.zeros((len(rows), len(day.factor_keys)))
    for j in range(3):
        h[np.arange(len(rows)), day.index[rows, j]] += day.values[rows, j]
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

    def dense() -> tuple[float, np.ndarray]:
        return dense_risk(dense_sigma(day, rows), w)

    def sample() -> tuple[float, np.ndarray]:
        return dense_risk(np.cov(returns), w)

    ways = {
        "eqrisk": ours,
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
        "dense_ms": round(ms["dense"], 3),
        "dense_given_ms": round(ms["dense_given"], 3),
        "sample_cov_ms": round(ms["sample"], 3),
        "dense_over_eqrisk": round(ms["dense"] / ms["eqrisk"], 1),
        "dense_given_over_eqrisk": round(ms["dense_given"] / ms["eqrisk"], 2),
        "sample_cov_over_eqrisk": round(ms["sample"] / ms["eqrisk"], 1),
        "vol_rel_diff_dense": float(abs(vol - d_vol) / d_vol),
        "contribution_max_diff_dense": float(np.max(np.abs(contrib - d_contrib))),
        "vol_rel_diff_sample_cov": round(float(abs(vol - s_vol) / vol), 4),
        "load_average_1m": round(load, 2),
    }


def run(b: RiskBench, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Each size in turn; the figures of each, keyed by its number of positions."""
    synthetic_day(10)  # warm what a first call compiles or caches
    result: dict[str, Any] = {"cpus": os.cpu_count()}
    for n in b.sizes:
        say(f"portfolio risk of {n} positions: eqrisk, dense, sample covariance ...")
        for key, value in measure(n, b).items():
            result[f"{n}_{key}"] = value
    return result
