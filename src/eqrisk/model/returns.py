"""Daily returns from a price panel: no forward fill, no gap spanning."""

from __future__ import annotations

import numpy as np


def simple_returns(close: np.ndarray) -> np.ndarray:
    """r_t = P_t / P_{t-1} - 1 where both sessions have a price, else NaN.

    A missing price is missing: the return into it and out of it are both NaN, so a multi-day
    move is never booked as one day's return (and never as zero).
    """
    close = np.asarray(close, dtype=np.float64)
    out = np.full(close.shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        out[..., 1:] = close[..., 1:] / close[..., :-1] - 1.0
    return out


def log_returns(simple: np.ndarray) -> np.ndarray:
    """ln(1 + r): the `return` metric of the spec's security_history."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log1p(simple)


def group_returns(
    returns: np.ndarray, members: np.ndarray, market_cap: np.ndarray | None
) -> np.ndarray:
    """Cap-weighted (by the previous session's market cap) return of a group of rows.

    Falls back to equal weights for the days where no member has a market cap. A day with no
    member return is NaN. This is the factor of a level that has no ETF in the data.
    """
    r = returns[members]
    has_r = np.isfinite(r)
    eq = np.where(has_r, 1.0, 0.0)
    weights = eq
    if market_cap is not None:
        caps = np.full(r.shape, np.nan)
        caps[:, 1:] = market_cap[members][:, :-1]
        cap_w = np.where(has_r & np.isfinite(caps), caps, 0.0)
        use_caps = cap_w.sum(axis=0) > 0
        weights = np.where(use_caps[None, :], cap_w, eq)
    total = weights.sum(axis=0)
    num = np.where(has_r, r, 0.0) * weights
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num.sum(axis=0) / total
    out[total <= 0] = np.nan
    return out
