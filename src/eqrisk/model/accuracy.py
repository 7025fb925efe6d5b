"""How good the risk forecasts were, out of sample: bias statistics of single stocks and of
portfolios, next to the weighted-average-volatility baseline on the same portfolios. Pure.

The bias statistic of a series of forecasts is b = std(R_t / s_t), R_t the realised return over
the horizon that starts at session t and s_t its forecast made with data up to t-1: 1 when the
forecasts are right on average, above 1 when they predict too little risk, below 1 too much. With
T independent normal outcomes a right forecast lands within 1 +- sqrt(2 / T) about two times in
three; fat tails widen that. It is measured over the whole period and over rolling 12-month
windows (252 sessions, one a month), whose mean absolute deviation from 1 says how well the
forecast follows the changes of risk.

Portfolios (fixed weights, rebalanced each session to the members with a forecast and a
return): random long-only, one per sector (equal weights), random long-short (longs sum to 1,
shorts to -1), and the random long-only ones hedged each session with their L3 ETF hedge (the
notionals `portfolio_risk` gives), whose forecast is their specific risk alone. The baseline is
what a user without a covariance gets: the weighted average of the positions' 23-session
volatilities, sum |w_i| s_i (the hedge's ETF legs are positions too).

The figures the build stores, `eqrisk evaluate` reports and the accuracy bench prints are all
`accuracy_state`'s running record (`record_of` in one step): one code path. The functions here
are the portfolios and the direct, whole-history computation that record is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from eqrisk.model.outcome_kernel import portfolio_days, twins
from eqrisk.model.risk_model import RiskModel

HEDGED_SIZES = (10, 50, 100, 200)  # equal-weight books hedged at L3, by number of names
FAMILIES = (
    "random_long_only",
    "sector",
    "long_short",
    "hedged_l3",
    *(f"hedged_l3_{size}" for size in HEDGED_SIZES),
)
YEAR = 252
MONTH = 21


@dataclass(frozen=True)
class Portfolios:
    """Portfolio weights (P x n), their family and whether they are hedged."""

    family: list[str]
    weights: np.ndarray
    hedged: np.ndarray

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """Each portfolio's rows and weights, padded with -1 and 0 (P x largest size)."""
        return self._members

    def twins(self) -> np.ndarray:
        """(P,) each portfolio's first earlier one with the same positions (`twins`)."""
        return self._twins

    @cached_property
    def _twins(self) -> np.ndarray:
        return twins(*self._members)

    @cached_property
    def _members(self) -> tuple[np.ndarray, np.ndarray]:
        held = self.weights != 0
        width = max(int(held.sum(axis=1).max()), 1) if len(held) else 1
        rows = np.full((len(held), width), -1, dtype=np.int64)
        weights = np.zeros((len(held), width))
        for p in range(len(held)):
            at = np.flatnonzero(held[p])
            rows[p, : len(at)] = at
            weights[p, : len(at)] = self.weights[p, at]
        return rows, weights


def make_portfolios(
    stocks: np.ndarray,
    sectors: np.ndarray,
    *,
    count: int = 100,
    size: int = 50,
    seed: int = 0,
    hedged_sizes: tuple[int, ...] = (),
    hedged_count: int = 50,
) -> Portfolios:
    """`count` random long-only portfolios of `size` stocks (weights uniform on the simplex),
    one equal-weight portfolio per sector (`sectors` (n,) int, -1 = none), `count` long-short
    ones (`size` longs, `size` shorts) and the long-only ones again, hedged; then, per size in
    `hedged_sizes` (at most the stocks there are), `hedged_count` equal-weight books of that
    many random stocks, hedged (family `hedged_l3_<size>`). Every book holds a stock: with
    fewer than two stocks there is no random or long-short one, with none no hedged one."""
    rng = np.random.default_rng(seed)
    n = len(sectors)
    rows: list[np.ndarray] = []
    family: list[str] = []
    pool = np.flatnonzero(stocks)
    size = min(size, len(pool) // 2)
    if size == 0:  # fewer than two stocks: no random or long-short book (all weights zero)
        count = 0
    for _ in range(count):
        w = np.zeros(n)
        w[rng.choice(pool, size, replace=False)] = rng.dirichlet(np.ones(size))
        rows.append(w)
        family.append("random_long_only")
    long_only = rows[:]
    for g in np.unique(sectors[stocks & (sectors >= 0)]).tolist():
        members = stocks & (sectors == g)
        rows.append(members / members.sum())
        family.append("sector")
    for _ in range(count):
        pick = rng.choice(pool, 2 * size, replace=False)
        w = np.zeros(n)
        w[pick[:size]] = rng.dirichlet(np.ones(size))
        w[pick[size:]] = -rng.dirichlet(np.ones(size))
        rows.append(w)
        family.append("long_short")
    rows += long_only
    family += ["hedged_l3"] * len(long_only)
    for names in hedged_sizes if len(pool) else ():  # no stock: no book to weight equally
        for _ in range(hedged_count):
            w = np.zeros(n)
            w[rng.choice(pool, min(names, len(pool)), replace=False)] = 1.0
            rows.append(w / w.sum())
            family.append(f"hedged_l3_{names}")
    weights = np.array(rows) if rows else np.zeros((0, n))
    hedged = np.array([f.startswith("hedged_l3") for f in family], dtype=bool)
    return Portfolios(family, weights, hedged)


@dataclass(frozen=True)
class Outcomes:
    """Realised returns and forecasts (rows x sessions t = start .. T-1 of the model), NaN where
    none: the model's forecast and the baseline's, on the horizon's sum of returns."""

    realised: np.ndarray
    model: np.ndarray
    baseline: np.ndarray


def _window_sums(x: np.ndarray, horizon: int) -> np.ndarray:
    """Sum over sessions t .. t+h-1 (NaN = 0), NaN where the window passes the end."""
    if horizon == 1:
        return x.copy()
    c = np.zeros((x.shape[0], x.shape[1] + 1))
    c[:, 1:] = np.cumsum(np.nan_to_num(x), axis=1)
    out = np.full(x.shape, np.nan)
    out[:, : x.shape[1] - horizon + 1] = c[:, horizon:] - c[:, :-horizon]
    return out


def previous(x: np.ndarray) -> np.ndarray:
    """The value of session t-1 at column t (NaN in column 0)."""
    out = np.full(x.shape, np.nan)
    out[:, 1:] = x[:, :-1]
    return out


def stock_outcomes(
    model: RiskModel, returns: np.ndarray, vol23: np.ndarray, horizon: int = 1
) -> Outcomes:
    """Every row's realised return and forecasts; `vol23` (n x T): the daily 23-session
    volatility published at each session (the baseline of session t is that of t-1)."""
    s = model.start
    realised = _window_sums(returns, horizon)[:, s:]
    scale = np.sqrt(horizon)
    predicted = model.predicted["risk_total_vol"] * scale
    ok = np.isfinite(returns[:, s:])
    return Outcomes(
        realised=np.where(ok, realised, np.nan),
        model=predicted,
        baseline=previous(vol23)[:, s:] * scale,
    )


def portfolio_outcomes(
    model: RiskModel,
    portfolios: Portfolios,
    returns: np.ndarray,
    factor_returns: np.ndarray,
    vol23: np.ndarray,
    factor_vol23: np.ndarray,
    horizon: int = 1,
) -> Outcomes:
    """Each portfolio's realised return and forecasts over the horizon from each session
    (`vol23`, `factor_vol23`: daily 23-session volatilities published at each session)."""
    s = model.start
    n_t = returns.shape[1]
    members, weights = portfolios.members()
    p = len(members)
    out = Outcomes(*(np.full((p, n_t - s), np.nan) for _ in range(3)))
    cov = model.factor_cov.cov
    # A member is present on session t with a forecast and a return on t.
    level = model.exposures.level
    avail = (level > 0) & np.isfinite(model.specific.var) & np.isfinite(returns[:, s:])
    index = model.exposures.index
    diag_ok = np.isfinite(np.diagonal(cov, axis1=1, axis2=2)).T  # (K, S)
    for j in range(3):
        idx = index[:, j]
        has = idx >= 0
        avail[has] &= ~(level[has] > j) | diag_ok[idx[has]]
    last = n_t - s - horizon + 1  # sessions whose horizon ends within the data
    style = model.exposures.style
    if style is None:
        style = np.zeros((0, returns.shape[0], cov.shape[0]))
    portfolio_days(
        members,
        weights,
        portfolios.hedged,
        avail[:, :last],
        index,
        level[:, :last].astype(np.int64),
        model.exposures.values[:, :, :last],
        cov[:last],
        model.specific.var[:, :last],
        np.nan_to_num(_window_sums(returns, horizon)[:, s : s + last]),
        np.nan_to_num(_window_sums(factor_returns, horizon)[:, s : s + last]),
        previous(vol23)[:, s : s + last],
        previous(factor_vol23)[:, s : s + last],
        style[:, :, :last],
        out.realised,
        out.model,
        out.baseline,
    )
    scale = np.sqrt(horizon)
    out.model[:] *= scale
    out.baseline[:] *= scale
    return out


def bias(realised: np.ndarray, forecast: np.ndarray, *, min_obs: int = 2) -> np.ndarray:
    """Per row, std (ddof 1) of realised / forecast over the sessions both exist."""
    with np.errstate(invalid="ignore", divide="ignore"):
        z = realised / forecast
    z[~np.isfinite(z)] = np.nan
    count = np.isfinite(z).sum(axis=1)
    out = np.full(z.shape[0], np.nan)
    ok = count >= min_obs
    if ok.any():
        out[ok] = np.nanstd(z[ok], axis=1, ddof=1)
    return out


def rolling_bias(
    realised: np.ndarray,
    forecast: np.ndarray,
    *,
    window: int = YEAR,
    step: int = MONTH,
    min_obs: int = YEAR // 2,
) -> np.ndarray:
    """Bias statistics (rows x windows) over windows of `window` sessions, one every `step`
    (the last ending on the last session); NaN for a window with fewer than `min_obs`."""
    n_t = realised.shape[1]
    ends = list(range(n_t, window - 1, -step))[::-1]
    out = np.full((realised.shape[0], len(ends)), np.nan)
    for j, end in enumerate(ends):
        out[:, j] = bias(realised[:, end - window : end], forecast[:, end - window : end],
                         min_obs=min_obs)  # fmt: skip
    return out


def mad_from_one(windows: np.ndarray) -> np.ndarray:
    """Per row, the mean absolute deviation from 1 of its window statistics."""
    dev = np.abs(windows - 1.0)
    count = np.isfinite(dev).sum(axis=1)
    out = np.full(windows.shape[0], np.nan)
    ok = count > 0
    out[ok] = np.nansum(dev[ok], axis=1) / count[ok]
    return out


def permutation_floor(
    realised: np.ndarray, forecast: np.ndarray, horizon: int, *, seed: int = 0
) -> np.ndarray:
    """Per row, the rolling 12-month mean absolute deviation from 1 that a forecast right on
    every session would still show with these tails: the row's daily standardised returns
    (realised / forecast, horizon 1) in a random order (no volatility left to forecast),
    summed over the horizon and scaled by 1 / sqrt(horizon)."""
    rng = np.random.default_rng(seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = realised / forecast
    z[~np.isfinite(z)] = np.nan
    shuffled = np.full(z.shape, np.nan)
    for i in range(z.shape[0]):
        at = np.flatnonzero(np.isfinite(z[i]))
        shuffled[i, at] = rng.permutation(z[i, at])
    summed = _window_sums(shuffled, horizon)
    summed[~np.isfinite(shuffled)] = np.nan
    ones = np.where(np.isfinite(summed), np.sqrt(horizon), np.nan)
    return mad_from_one(rolling_bias(summed, ones))
