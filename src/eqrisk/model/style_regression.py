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

from eqrisk.model.styles import StyleParams, block_exposures, descriptor_block


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
    session_major: tuple[np.ndarray, np.ndarray] | None = None,
) -> StyleReturns:
    """The regression of every session (columns of `residuals` (n x S'), of `exposures`
    (styles x n x S'), of `cap` (n x S'), the caps of the session before); the intercept, when
    asked, is the first factor. `session_major`: `_session_major` of the exposures and of the
    regression weights where the caller holds them already."""
    from eqrisk.model.risk_kernel import parallel_blocks, style_returns_kernel  # numba: builds

    n_style, n, n_s = exposures.shape
    if session_major is None:
        session_major = _session_major(exposures), _session_major(regression_weights(cap, power))
    p_all = n_style + int(intercept)
    # The kernel reads and writes session-major copies (T, n, ...): a session's stocks are
    # contiguous there, and (n, T) arrays read one session at a time missed the cache.
    resid_t = _session_major(residuals)
    used, leverage = np.zeros((n_s, n), dtype=bool), np.zeros((n_s, n))
    returns, tstat = np.full((p_all, n_s), np.nan), np.full((p_all, n_s), np.nan)
    r2, stocks = np.full(n_s, np.nan), np.zeros(n_s, dtype=np.int64)
    fitted = resid_t.copy()
    style_returns_kernel(
        resid_t, session_major[0], session_major[1], intercept, min_stocks, returns, tstat, r2, stocks, fitted, used, leverage, parallel_blocks(n_s),
    )  # fmt: skip
    return StyleReturns(
        returns=returns, tstat=tstat, r2=r2, stocks=stocks, residuals=_unit_major(fitted),
        used=_unit_major(used), leverage=_unit_major(leverage),
    )  # fmt: skip


def _session_major(a: np.ndarray) -> np.ndarray:
    """(..., n, T) -> (T, n, ...) contiguous, float64 (bool kept); a block of styles (S, n, T)
    by `transpose_kernel`."""
    a = np.asarray(a)
    if a.ndim == 3 and a.dtype != bool:
        from eqrisk.model.transpose_kernel import session_major_kernel  # numba: builds only

        block = np.ascontiguousarray(a, dtype=np.float64)
        moved = np.empty((a.shape[2], a.shape[1], a.shape[0]))
        session_major_kernel(block, moved)
        return moved
    out: np.ndarray = np.ascontiguousarray(
        np.moveaxis(a, (-1, -2), (0, 1)), dtype=None if a.dtype == bool else np.float64
    )
    return out


def _unit_major(a: np.ndarray) -> np.ndarray:
    """(T, n) -> (n, T) contiguous."""
    out: np.ndarray = np.ascontiguousarray(a.T)
    return out


def regression_weights(cap: np.ndarray, power: float) -> np.ndarray:
    """cap ** power where the cap is finite and positive (NaN elsewhere: out of the layer)."""
    c = np.asarray(cap, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(c) & (c > 0)
    out: np.ndarray = np.where(ok, np.where(ok, c, 1.0) ** power, np.nan)
    return out


def estimation_noise(
    exposures: np.ndarray,
    cap: np.ndarray,
    reg: StyleReturns,
    specific_var: np.ndarray,
    power: float = 0.5,
    session_major: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """(sessions, S, S): the covariance of each session's factor-return estimates that comes
    from the specific returns, (X'WX)^-1 X'W Omega W X (X'WX)^-1 with Omega the specific
    variances forecast for that session (a stock without one: the session's median). The
    estimated factor returns carry it on top of the true ones; the same specific returns are
    counted again in D, so the factor covariance leaves it out. `session_major`: as
    `style_returns`'."""
    from eqrisk.model.risk_kernel import estimation_noise_kernel, parallel_blocks  # numba: builds

    p, n_s = reg.returns.shape
    out = np.zeros((n_s, p, p))
    if session_major is None:
        session_major = _session_major(exposures), _session_major(regression_weights(cap, power))
    estimation_noise_kernel(
        session_major[0], session_major[1], _session_major(reg.used), np.isfinite(reg.returns) & (reg.stocks > 0)[None, :],
        _session_major(specific_var), p == exposures.shape[0] + 1, out, parallel_blocks(n_s),
    )  # fmt: skip
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


@dataclass(frozen=True)
class SecondLayer:
    """`second_layer`'s exposures (S, n, T - start) and regression, with the session-major
    copies of the exposures and the regression weights both kernels read (`_session_major`)."""

    exposures: np.ndarray
    regression: StyleReturns
    session_major: tuple[np.ndarray, np.ndarray]


def second_layer(
    returns: np.ndarray,
    factor_returns: np.ndarray,
    factor_index: np.ndarray,
    resid: np.ndarray,
    params: StyleParams,
    inputs: StyleInputs,
    start: int,
) -> SecondLayer:
    """Exposures (S, n, T - start) of sessions start..T-1 (descriptors of the close before),
    the regression of those sessions' L3 residuals on them, and the session-major copies of
    the exposures and weights that `estimation_noise` reads again."""
    n, n_t = returns.shape
    market_row = np.where(factor_index[:, 0] >= 0, factor_index[:, 0], 0)
    market = np.where((factor_index[:, 0] >= 0)[:, None], factor_returns[market_row], np.nan)
    first = max(start - 1, 0)
    prev = slice(first, max(n_t - 1, first))  # the close before each forecast session t >= 1
    width = prev.stop - prev.start
    names = list(params.names)
    lead = int(params.intercept)  # the intercept's row comes first
    # One block: the kernel writes the styles' rows of the sessions with descriptors (every
    # cell of them), the sessions before hold NaN, the intercept's row is written below.
    exposures = np.empty((lead + len(names), n, n_t - start))
    exposures[lead:, :, : n_t - start - width] = np.nan
    if width:
        raw = descriptor_block(
            returns, market, inputs.cap, inputs.turnover, params.names, columns=prev
        )  # fmt: skip
        block_exposures(
            raw, names, inputs.cap[:, prev], inputs.stocks,
            out=exposures[lead:, :, n_t - start - width :],
        )  # fmt: skip
    cap_prev = cap_before(inputs.cap, start)
    if params.intercept:
        in_layer = inputs.stocks[:, None] & np.isfinite(cap_prev) & (cap_prev > 0)
        exposures[0] = np.where(in_layer, 1.0, np.nan)
    # Both kernels read the session-major copies: made once (the regression's exposures are
    # the styles', a view of the block without the intercept's column).
    block_t = _session_major(exposures)
    weights_t = _session_major(regression_weights(cap_prev, params.weight_power))
    regression = style_returns(
        resid,
        exposures[lead:],
        cap_prev,
        intercept=params.intercept,
        min_stocks=params.min_stocks,
        power=params.weight_power,
        session_major=(block_t[:, :, lead:], weights_t),
    )
    return SecondLayer(exposures, regression, (block_t, weights_t))


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
