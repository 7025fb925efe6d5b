"""Hedge quality: how much of a stock's variance the published hedge removed, out of sample.

For level k, the residual `lk_rr` of day t uses the hedge of day t-1, so it is what a holder of
that hedge realised the next day. `lk_hq` at t is var(lk_rr) / var(r) over the trailing window
(the same joint days for both): 1 = the hedge removed nothing, 0.46 = 54% of the variance gone.
"""

from __future__ import annotations

import warnings

import numpy as np

from eqrisk.model.cascade import rolling_std


def hedge_quality(
    r: np.ndarray, rr: np.ndarray, *, window: int, min_obs: int, start: int = 0
) -> np.ndarray:
    """Trailing-window var(rr) / var(r) per row, on the days where both exist: sessions
    start..T-1 (n x (T - start)), each as a run from column 0 gives it (`rolling_std` runs
    from the window anchor at or before `start`)."""
    joint = np.isfinite(r) & np.isfinite(rr)
    v_r = _std(np.where(joint, r, np.nan), window, min_obs, start) ** 2
    v_e = _std(np.where(joint, rr, np.nan), window, min_obs, start) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = v_e / v_r
    out[~(v_r > 1e-20)] = np.nan
    return out


def _std(values: np.ndarray, window: int, min_obs: int, start: int) -> np.ndarray:
    """`rolling_std` of sessions start..T-1 only."""
    out = np.empty(values.shape)
    rolling_std(values, window=window, min_obs=min_obs, out=out, start=start)
    return out[:, start:]


def pooled_hedge_quality(r: np.ndarray, rr: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """Across a set of rows: each row's var(rr) / var(r) over all its joint days; the median,
    the mean and the pooled ratio (sum of residual variances over sum of return variances)."""
    ratios, v_es, v_rs = [], [], []
    for i in rows.tolist():
        joint = np.isfinite(r[i]) & np.isfinite(rr[i])
        if joint.sum() < 2:
            continue
        v_r = float(np.var(r[i, joint], ddof=1))
        v_e = float(np.var(rr[i, joint], ddof=1))
        if v_r > 0:
            ratios.append(v_e / v_r)
            v_es.append(v_e)
            v_rs.append(v_r)
    if not ratios:
        return {"stocks": 0, "median": float("nan"), "mean": float("nan"), "pooled": float("nan")}
    return {
        "stocks": len(ratios),
        "median": float(np.median(ratios)),
        "mean": float(np.mean(ratios)),
        "pooled": float(np.sum(v_es) / np.sum(v_rs)),
    }


def vasicek_market_beta(
    beta: np.ndarray, er: np.ndarray, n_obs: np.ndarray, groups: np.ndarray, min_members: int = 3
) -> np.ndarray:
    """Market betas (n x T) shrunk toward their group's cross-sectional mean (Vasicek 1973).

    Each beta's sampling variance comes from its own regression: with R² = `er` on n
    observations, s² = b² (1 - R²) / ((n - 2) R²). Per session and group (`groups` (n,), -1 =
    none): prior mean m = mean of the group's betas, prior variance t² = their cross-sectional
    variance less the mean s² (at least 1e-6), and b* = (t² b + s² m) / (t² + s²). Rows outside
    a group, or in a group with fewer than `min_members` betas that day, keep their beta.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        s2 = beta**2 * (1.0 - er) / ((n_obs - 2.0) * er)
    out = beta.copy()
    for g in np.unique(groups[groups >= 0]).tolist():
        rows = np.flatnonzero(groups == g)
        b, v = beta[rows], s2[rows]
        ok = np.isfinite(b) & np.isfinite(v)
        count = ok.sum(axis=0)
        bs = np.where(ok, b, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(bs, axis=0)
            tau2 = np.nanvar(bs, axis=0, ddof=1) - np.nanmean(np.where(ok, v, np.nan), axis=0)
            tau2 = np.maximum(tau2, 1e-6)
            shrunk = (tau2 * b + v * mean) / (tau2 + v)
        use = ok & (count >= min_members)[None, :]
        out[rows] = np.where(use, shrunk, b)
    return out
