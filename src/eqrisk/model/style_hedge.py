"""A style-neutral hedge with tradable factor ETFs: legs in the equity factor ETFs of the data
(MTUM, USMV, QUAL, VLUE, SIZE, IWM, IWD, IWF) that take the book's exposure to the second layer's
style factors down as far as those ETFs allow. Pure: arrays in, arrays out.

The model itself knows these ETFs as rows modelled on the market factor alone (their style
content is in their specific variance D). For the style-neutral hedge each is given style
loadings: the zero-mean least-squares slopes of its specific return (the return its market hedge
leaves) on the style factors' returns over the 252 sessions before the forecast session (at
least 126 where all are known; no look-ahead), and its D is scaled by 1 - R^2 of that fit (the
share of its specific variance the styles do not explain), so its total variance stays the
model's. With B (m x S) those loadings, F_ss the style block of F, x the book's style exposures
and d the legs' specific variances, the legs n minimise what the style factors and the legs
themselves add to the variance after the ETF hedge,

    (x + B'n)' F_ss (x + B'n) + sum_e n_e^2 d_e,   so   n = -(B F_ss B' + diag(d))^-1 B F_ss x,

a least-squares solve of the exposures in F's metric, held back by each leg's own noise: a leg
whose ETF adds more specific risk than the style risk it removes is not taken. The legs' market
exposure is then sold with the book's in the ETF hedge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from eqrisk.model.risk_model import RiskModelDay

STYLE_ETFS = ("MTUM", "USMV", "QUAL", "VLUE", "SIZE", "IWM", "IWD", "IWF")
LOADING_WINDOW = 252
LOADING_MIN_OBS = 126


@dataclass(frozen=True)
class EtfLoadings:
    """The factor ETFs a day's style hedge can trade, with their style loadings."""

    keys: list[str]
    rows: np.ndarray  # (m,) rows of the model day
    loadings: np.ndarray  # (m, S) on the day's style factors (the last S rows of F)
    r2: np.ndarray  # (m,) share of each ETF's specific variance its loadings explain


def style_loadings(
    resid: np.ndarray, style_returns: np.ndarray, min_obs: int = LOADING_MIN_OBS
) -> tuple[np.ndarray, np.ndarray]:
    """Zero-mean least-squares slopes (m, S) of each row of `resid` (m x W) on the style factor
    returns (S x W) over the sessions where both are known, and the uncentred R^2 (m,). A factor
    with fewer than `min_obs` returns in the window gets 0 (it is left out of the fit); a row with
    fewer than `min_obs` sessions, NaN."""
    m, s = resid.shape[0], style_returns.shape[0]
    loadings = np.full((m, s), np.nan)
    r2 = np.full(m, np.nan)
    cols = np.isfinite(style_returns).sum(axis=1) >= min_obs
    g = style_returns[cols]
    for i in range(m):
        days = np.isfinite(resid[i]) & np.isfinite(g).all(axis=0)
        if days.sum() < max(min_obs, cols.sum() + 1) or not cols.any():
            continue
        y = resid[i, days]
        coef = np.linalg.lstsq(g[:, days].T, y, rcond=None)[0]
        loadings[i] = 0.0
        loadings[i, cols] = coef
        r2[i] = 1.0 - float(np.sum((y - coef @ g[:, days]) ** 2)) / float(np.sum(y * y))
    return loadings, r2


def tradable_etfs(
    day: RiskModelDay, keys: Sequence[str], loadings: np.ndarray, r2: np.ndarray
) -> EtfLoadings:
    """The ETFs of `keys` (with their loadings, m x S, and R^2) the day can use: in the universe,
    with a forecast and finite loadings."""
    take = [
        i for i, k in enumerate(keys)
        if k in day.row_of and day.usable[day.row_of[k]] and np.isfinite(loadings[i]).all()
    ]  # fmt: skip
    return EtfLoadings(
        keys=[keys[i] for i in take],
        rows=np.array([day.row_of[keys[i]] for i in take], dtype=np.int64),
        loadings=loadings[take].reshape(len(take), loadings.shape[1]),
        r2=r2[take],
    )


def with_loadings(day: RiskModelDay, etfs: EtfLoadings) -> RiskModelDay:
    """The day with the ETFs' rows given their style loadings (0 on a factor without a
    covariance that session) and their D scaled by 1 - R^2."""
    if day.style is None or not len(etfs.keys):
        return day
    ready = np.isfinite(np.diag(day.cov)[day.n_etf :])
    style = day.style.copy()
    style[etfs.rows] = np.where(ready[None, :], etfs.loadings, 0.0)
    specific = day.specific_var.copy()
    specific[etfs.rows] *= np.clip(1.0 - etfs.r2, 0.0, 1.0)
    return replace(day, style=style, specific_var=specific)


def neutral_legs(day: RiskModelDay, x_style: np.ndarray, etfs: EtfLoadings) -> np.ndarray:
    """The legs (m,) of the module's docstring on `day` (already `with_loadings`): x_style (S,)
    the book's exposure to the day's style factors (0 where a factor has no covariance)."""
    if day.style is None or not len(etfs.keys):
        return np.zeros(len(etfs.keys))
    k0 = day.n_etf
    ready = np.flatnonzero(np.isfinite(np.diag(day.cov)[k0:]))
    f = day.cov[np.ix_(ready + k0, ready + k0)]
    b = day.style[np.ix_(etfs.rows, ready)]
    d = day.specific_var[etfs.rows]
    lhs = b @ f @ b.T + np.diag(d)
    legs: np.ndarray = -np.linalg.lstsq(lhs, b @ f @ x_style[ready], rcond=None)[0]
    return legs
