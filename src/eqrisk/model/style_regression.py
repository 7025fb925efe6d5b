"""Returns of the second-layer factors: each session, a weighted least-squares regression across
stocks of the specific returns the ETF layer leaves (the L3 residuals) on the style exposures
known the session before, weights the square root of cap. Pure: arrays in, arrays out.

Per session t, over the stocks with a residual, exposures and a cap (at least `min_stocks`, and
more than twice the number of factors): g_t = (X'WX)^-1 X'Wy, the factor returns; the residual
y - X g_t is the specific return after both layers (a stock outside the regression keeps its
residual: its style exposures are 0 that session). A style whose exposures are all zero or
missing that session (liquidity on data without volume) is left out and has no return. Kept
per session: the weighted R^2 (centred when there is an intercept, as statsmodels' WLS) and each
factor's t-statistic (conventional standard errors), and each stock's leverage h (the hat
matrix's diagonal: its residual's variance is (1 - h) times its specific return's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqrisk.model.styles import StyleParams, descriptors, style_exposures


@dataclass(frozen=True)
class StyleReturns:
    """Sessions start..T-1 of the regression: factor returns, t-statistics, R^2, stocks used,
    and the residuals after both layers (n x sessions)."""

    returns: np.ndarray  # (S, sessions), NaN where the factor was not estimated
    tstat: np.ndarray  # (S, sessions)
    r2: np.ndarray  # (sessions,)
    stocks: np.ndarray  # (sessions,) int: stocks in the regression
    residuals: np.ndarray  # (n, sessions)
    used: np.ndarray  # (n, sessions) bool: the stocks of each session's regression
    # (n, sessions): each stock's leverage h in its session's regression (0 outside it)
    leverage: np.ndarray | None = None


@dataclass(frozen=True)
class Fit:
    params: np.ndarray
    tstat: np.ndarray
    r2: float
    resid: np.ndarray
    leverage: np.ndarray  # (m,) h_i = w_i x_i' (X'WX)^-1 x_i, the diagonal of the hat matrix


def wls(y: np.ndarray, x: np.ndarray, w: np.ndarray, *, centred: bool) -> Fit:
    """Weighted least squares of y (m,) on x (m, p), weights w (m,): coefficients, their
    t-statistics, R^2 (centred on the weighted mean of y if `centred`) and residuals."""
    sw = np.sqrt(w)
    xw = x * sw[:, None]
    yw = y * sw
    q, r = np.linalg.qr(xw)
    params = np.linalg.solve(r, q.T @ yw)
    resid = y - x @ params
    m, p = x.shape
    ssr = float(np.sum(w * resid * resid))
    sigma2 = ssr / (m - p)
    r_inv = np.linalg.solve(r, np.eye(p))
    se = np.sqrt(sigma2 * np.sum(r_inv * r_inv, axis=1))
    if centred:
        mean = np.sum(w * y) / np.sum(w)
        tss = float(np.sum(w * (y - mean) ** 2))
    else:
        tss = float(np.sum(w * y * y))
    leverage = np.sum(q * q, axis=1)
    return Fit(params, params / se, 1.0 - ssr / tss, resid, leverage)


def style_returns(
    residuals: np.ndarray,
    exposures: np.ndarray,
    cap: np.ndarray,
    *,
    intercept: bool,
    min_stocks: int = 30,
    power: float = 0.5,
) -> StyleReturns:
    """The regression of every session (columns of `residuals` (n x S'), of `exposures`
    (styles x n x S'), of `cap` (n x S'), the caps of the session before); the intercept, when
    asked, is the first factor."""
    n_style, n, n_s = exposures.shape
    p_all = n_style + int(intercept)
    out = StyleReturns(
        returns=np.full((p_all, n_s), np.nan),
        tstat=np.full((p_all, n_s), np.nan),
        r2=np.full(n_s, np.nan),
        stocks=np.zeros(n_s, dtype=np.int64),
        residuals=residuals.copy(),
        used=np.zeros((n, n_s), dtype=bool),
        leverage=np.zeros((n, n_s)),
    )
    for t in range(n_s):
        y = residuals[:, t]
        x = exposures[:, :, t].T
        c = cap[:, t]
        ok = np.isfinite(y) & np.isfinite(x).all(axis=1) & np.isfinite(c) & (c > 0)
        cols = np.flatnonzero(np.any(x[ok] != 0.0, axis=0))
        design = x[np.ix_(ok, cols)]
        if intercept:
            design = np.column_stack([np.ones(int(ok.sum())), design])
            cols = np.concatenate([[-1], cols]) + 1
        m = int(ok.sum())
        if m < max(min_stocks, 2 * len(cols) + 1) or len(cols) == 0:
            continue
        fit = wls(y[ok], design, c[ok] ** power, centred=intercept)
        out.returns[cols, t] = fit.params
        out.tstat[cols, t] = fit.tstat
        out.r2[t] = fit.r2
        out.stocks[t] = m
        out.residuals[ok, t] = fit.resid
        out.used[ok, t] = True
        assert out.leverage is not None
        out.leverage[ok, t] = fit.leverage
    return out


def _design(exposures: np.ndarray, reg: StyleReturns, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Session t's design matrix over its regression's stocks and the factors it estimated."""
    est = np.flatnonzero(np.isfinite(reg.returns[:, t]))
    intercept = reg.returns.shape[0] == exposures.shape[0] + 1
    rows = reg.used[:, t]
    x = exposures[:, rows, t].T
    if intercept:
        x = np.column_stack([np.ones(int(rows.sum())), x])
    return x[:, est], est


def estimation_noise(
    exposures: np.ndarray,
    cap: np.ndarray,
    reg: StyleReturns,
    specific_var: np.ndarray,
    power: float = 0.5,
) -> np.ndarray:
    """(sessions, S, S): the covariance of each session's factor-return estimates that comes
    from the specific returns, (X'WX)^-1 X'W Omega W X (X'WX)^-1 with Omega the specific
    variances forecast for that session (a stock without one: the session's median). The
    estimated factor returns carry it on top of the true ones; the same specific returns are
    counted again in D, so the factor covariance leaves it out."""
    p, n_s = reg.returns.shape
    out = np.zeros((n_s, p, p))
    for t in range(n_s):
        if reg.stocks[t] == 0:
            continue
        x, est = _design(exposures, reg, t)
        rows = reg.used[:, t]
        w = cap[rows, t] ** power
        omega = specific_var[rows, t]
        known = np.isfinite(omega)
        if not known.any():
            continue
        omega = np.where(known, omega, np.median(omega[known]))
        xw = x * w[:, None]
        a = np.linalg.solve(xw.T @ x, xw.T)  # (X'WX)^-1 X'W
        cov = (a * omega) @ a.T
        # The upper triangle mirrored: the product is symmetric only to rounding, and the
        # noise taken out of F's sums would leave F asymmetric by as much.
        out[t][np.ix_(est, est)] = np.triu(cov) + np.triu(cov, 1).T
    return out


@dataclass(frozen=True)
class StyleInputs:
    """What the second layer reads besides returns: caps (n x T, at each close), turnover
    (n x T, volume / shares; None where the data has no volume) and which rows are stocks."""

    cap: np.ndarray
    turnover: np.ndarray | None
    stocks: np.ndarray


def cap_before(cap: np.ndarray, start: int) -> np.ndarray:
    """(n, T - start): the cap at the close before each session start..T-1 (NaN for 0)."""
    out = np.full((cap.shape[0], cap.shape[1] - start), np.nan)
    first = max(start - 1, 0)
    width = cap.shape[1] - 1 - first
    if width > 0:
        out[:, out.shape[1] - width :] = cap[:, first : cap.shape[1] - 1]
    return out


def second_layer(
    returns: np.ndarray,
    factor_returns: np.ndarray,
    factor_index: np.ndarray,
    resid: np.ndarray,
    params: StyleParams,
    inputs: StyleInputs,
    start: int,
) -> tuple[np.ndarray, StyleReturns]:
    """Exposures (S, n, T - start) of sessions start..T-1 (descriptors of the close before)
    and the regression of those sessions' L3 residuals on them."""
    n, n_t = returns.shape
    market_row = np.where(factor_index[:, 0] >= 0, factor_index[:, 0], 0)
    market = np.where((factor_index[:, 0] >= 0)[:, None], factor_returns[market_row], np.nan)
    first = max(start - 1, 0)
    raw = descriptors(
        returns, market, inputs.cap, inputs.turnover, params.names,
        columns=slice(first, max(n_t - 1, first)),
    )  # fmt: skip
    prev = range(first, max(n_t - 1, first))  # the close before each forecast session t >= 1
    exposures = np.full((len(raw), n, n_t - start), np.nan)
    if len(prev):
        exposures[:, :, n_t - start - len(prev) :] = style_exposures(
            raw, inputs.cap, inputs.stocks, prev
        )
    cap_prev = cap_before(inputs.cap, start)
    if params.intercept:
        in_layer = inputs.stocks[:, None] & np.isfinite(cap_prev) & (cap_prev > 0)
        exposures = np.concatenate([np.where(in_layer, 1.0, np.nan)[None], exposures])
    regression = style_returns(
        resid,
        exposures[1:] if params.intercept else exposures,
        cap_prev,
        intercept=params.intercept,
        min_stocks=params.min_stocks,
        power=params.weight_power,
    )
    return exposures, regression


def leverage_adjusted(resid: np.ndarray, regression: StyleReturns) -> np.ndarray:
    """The residuals after both layers over sqrt(1 - h), h each stock's leverage in its
    session's regression: a weighted least-squares residual's variance is about (1 - h) times
    the specific return's (exactly where the weights are the inverse variances), so D
    estimated from the plain residuals is low by the leverage the regression gives each stock."""
    h = regression.leverage
    if h is None:
        return resid
    out: np.ndarray = resid / np.sqrt(1.0 - np.clip(h, 0.0, 0.5))
    return out
