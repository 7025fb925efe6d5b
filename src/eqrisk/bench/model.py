"""`eqrisk bench model`: the L3 cascade over a large synthetic panel, side by side with what a
user would otherwise write (statsmodels RollingOLS per stock), in one run, with the answers
compared. Speed is reported as a ratio; the two are timed on the same machine in one process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqrisk.model.cascade import rolling_cascade, rolling_std


@dataclass(frozen=True)
class ModelBench:
    symbols: int = 5000
    sessions: int = 7560
    window: int = 252
    min_obs: int = 126
    baseline_symbols: int = 10
    seed: int = 0


def synthetic_returns(b: ModelBench) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stock returns n x T, factor returns F x T, factor index n x 3): 11 sectors and 20
    subsectors over one market, every stock fully observed (so RollingOLS windows agree)."""
    rng = np.random.default_rng(b.seed)
    t = b.sessions
    m = rng.standard_t(5, t) * 0.01
    sec = 0.9 * m + rng.normal(0, 0.006, (11, t))
    sub = 0.5 * m + 0.6 * sec[np.arange(20) % 11] + rng.normal(0, 0.008, (20, t))
    factors = np.vstack([m, sec, sub])
    fidx = np.empty((b.symbols, 3), dtype=np.int64)
    fidx[:, 0] = 0
    sub_of = rng.integers(0, 20, b.symbols)
    fidx[:, 1] = 1 + sub_of % 11
    fidx[:, 2] = 12 + sub_of
    betas = rng.uniform(0.2, 1.4, (b.symbols, 3))
    returns = np.empty((b.symbols, t))
    for lo in range(0, b.symbols, 1000):
        hi = min(b.symbols, lo + 1000)
        x = factors[fidx[lo:hi]]  # (k, 3, T)
        returns[lo:hi] = np.einsum("kj,kjt->kt", betas[lo:hi], x) + rng.normal(
            0, 0.015, (hi - lo, t)
        )
    return returns, factors, fidx


def run(b: ModelBench, say: Any = print) -> dict[str, Any]:
    from statsmodels.regression.rolling import RollingOLS

    returns, factors, fidx = synthetic_returns(b)
    # Warm the JIT on a small slice so compilation is not timed.
    rolling_cascade(
        returns[:2, :300], factors[:, :300], fidx[:2], window=b.window, min_obs=b.min_obs
    )
    rolling_std(returns[:2, :300], window=b.window, min_obs=b.min_obs)
    say(f"eqrisk cascade: {b.symbols} symbols x {b.sessions} sessions ...")
    t0 = time.perf_counter()
    out = rolling_cascade(returns, factors, fidx, window=b.window, min_obs=b.min_obs)
    rolling_std(returns, window=b.window, min_obs=b.min_obs)
    ours = time.perf_counter() - t0

    k = b.baseline_symbols
    say(f"statsmodels RollingOLS: {k} symbols (per-stock loop, extrapolated to {b.symbols}) ...")
    max_diff = 0.0
    t0 = time.perf_counter()
    fits = []
    for i in range(k):
        x = np.column_stack([np.ones(b.sessions), factors[fidx[i]].T])
        res = RollingOLS(returns[i], x, window=b.window, min_nobs=b.min_obs, expanding=True).fit(
            params_only=True
        )
        fits.append(res.params)
    baseline_k = time.perf_counter() - t0
    for i, params in enumerate(fits):
        got = np.column_stack([out[f][i] for f in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")])
        both = np.isfinite(params[:, 1:]) & np.isfinite(got)
        assert both.sum() > 0
        max_diff = max(max_diff, float(np.max(np.abs(got[both] - params[:, 1:][both]))))
        same_pub = np.array_equal(np.isfinite(got[:, 0]), np.isfinite(params[:, 1]))
        assert same_pub, "publication dates differ from RollingOLS"
    baseline = baseline_k / k * b.symbols
    return {
        "symbols": b.symbols,
        "sessions": b.sessions,
        "window": b.window,
        "min_obs": b.min_obs,
        "eqrisk_seconds": round(ours, 3),
        "rollingols_seconds_measured": round(baseline_k, 3),
        "rollingols_symbols_measured": k,
        "rollingols_seconds_extrapolated": round(baseline, 1),
        "speedup": round(baseline / ours, 1),
        "max_abs_diff_vs_rollingols": max_diff,
    }
