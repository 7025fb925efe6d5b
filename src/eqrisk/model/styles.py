"""Style exposures of the risk model's second layer: descriptors from prices, market caps and
volume only, in the manner of the USE4 descriptors, standardised across the universe each
session. Pure: arrays in, arrays out.

Descriptors of session t use data up to the close of t (the risk model uses those of t-1 as the
exposures of session t):

- size: ln(cap_t);
- momentum: sum over the 504 sessions t-21-503 .. t-21 (the last month left out, where prices
  revert) of w_k ln(1 + r), w_k = 0.5^(k / 126) from the most recent; a missing return adds 0;
  at least 252 returns;
- beta: EWMA (half-life 63, 252 sessions) zero-mean regression slope of the stock's returns on
  its market factor's, sum w r m / sum w m^2 over the days both exist; at least 126;
- residual volatility: EWMA (half-life 42, 252 sessions) root mean square of the daily returns,
  standardised, then made orthogonal to size and beta (the residual of an equal-weight
  cross-sectional regression on them), at least 63 returns;
- liquidity: turnover u = volume / shares outstanding = volume * close / cap; 0.35 ln(sum of u
  over 21 sessions) + 0.35 ln(mean monthly sum over 63) + 0.3 ln(mean monthly sum over 252),
  each window at least half full; orthogonal to size; absent where the data has no volume;
- short-term reversal: sum of w_k ln(1 + r) over the last 21 sessions, half-life 5.

Every window is a fixed-order weighted sum of the window's own values (no running recursion), so
a descriptor depends on its window only: a run that starts later or ends later gives the same
bits, which is what lets a resumed risk model equal a full run.

Standardisation, per session over the stocks with a cap: z = (x - cap-weighted mean) / equal-
weighted standard deviation, limited to +-3 and standardised again, for as many rounds as it
takes (at most 10) until no value is beyond 3.05 (one far outlier inflates the first standard
deviation; each round lowers its share), so the cap-weighted mean is 0 and the standard
deviation 1 exactly. A
stock with a cap but no descriptor gets 0 (the average); a stock without a cap is out of the
style layer that session (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STYLE_NAMES = ("size", "momentum", "beta", "residual_volatility", "liquidity", "reversal")
STYLE_TEXT = {
    "size": "log market cap",
    "momentum": "EWMA (half-life 126) sum of log returns over 504 sessions, last 21 left out",
    "beta": "EWMA (half-life 63) slope on the market factor over 252 sessions",
    "residual_volatility": "EWMA (half-life 42) volatility over 252 sessions, net of size and beta",
    "liquidity": "log turnover over 21, 63 and 252 sessions (0.35/0.35/0.3), net of size",
    "reversal": "EWMA (half-life 5) sum of log returns over the last 21 sessions",
}
LIMIT = 3.0
ROUNDS = 10  # limit-and-standardise rounds at most, until no value is beyond LIMIT + TOLERANCE
TOLERANCE = 0.05


@dataclass(frozen=True)
class StyleParams:
    """Which styles the second layer uses (a subset of STYLE_NAMES, in that order) and whether
    it has an intercept (the cross-sectional mean of the residuals, `residual_market`);
    `noise`: take the factor returns' estimation error out of F (`estimation_noise`)."""

    names: tuple[str, ...] = STYLE_NAMES
    intercept: bool = True
    min_stocks: int = 30
    noise: bool = True
    weight_power: float = 0.5  # regression weights cap^power (0.5: the square root of cap)
    # Shrink each style factor's return toward zero by its signal share (`covariance`: the
    # variance of the shrunk return, kappa (V - N) with kappa = (V - N) / V, V its EWMA second
    # moment and N that of its estimation noise); only with `noise`.
    shrink: bool = False
    # The style variances become kappa^shrink_power (V - N): 1 the shrunk return's variance,
    # 0 the unbiased V - N; between them, part of the posterior variance kept
    shrink_power: float = 1.0
    # Estimate D from the residuals divided by sqrt(1 - h), h each stock's leverage in its
    # session's regression (a WLS residual's variance is (1 - h) times the return's).
    leverage: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.shrink_power <= 1.0:
            raise ValueError(f"shrink_power must be within [0, 1]; got {self.shrink_power}")
        unknown = set(self.names) - set(STYLE_NAMES)
        if unknown or len(set(self.names)) != len(self.names):
            raise ValueError(f"styles must be distinct names of {STYLE_NAMES}; got {self.names}")

    @classmethod
    def calibrated(cls) -> StyleParams:
        """The settings measured best (docs/decisions/risk-forecast.md, the second layer)."""
        return cls(shrink=True, shrink_power=0.75)

    @property
    def factor_names(self) -> list[str]:
        return (["residual_market"] if self.intercept else []) + list(self.names)

    def history(self) -> int:
        """Sessions of returns before a forecast session its exposures read."""
        return 504 + 21 + 1


def ewma_weights(halflife: float, length: int) -> np.ndarray:
    """EWMA weights of a window of `length` sessions, oldest first (the newest weighs 1)."""
    return np.asarray(0.5 ** (np.arange(length)[::-1] / halflife), dtype=np.float64)


def window_sums(
    x: np.ndarray, weights: np.ndarray, lag: int = 0, *, columns: slice | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per row and column t: sum of weights * x over the window of len(weights) sessions ending
    at t - lag (oldest first), missing values skipped, and the number of values present.
    Columns whose window starts before column 0 use what there is. `columns`: the columns to
    compute (default all); others are NaN and 0."""
    n, n_t = x.shape
    size = len(weights)
    pad = size + lag
    padded = np.full((n, n_t + pad), np.nan)
    padded[:, pad:] = x
    present = np.isfinite(padded)
    values = np.where(present, padded, 0.0)
    sums = np.full((n, n_t), np.nan)
    count = np.zeros((n, n_t))
    lo, hi = (0, n_t) if columns is None else (columns.start or 0, columns.stop or n_t)
    # Column t's window: padded columns t + pad - lag - size + 1 .. t + pad - lag, summed in
    # numpy's order of `(window * weights).sum(axis=-1)` (`window_kernel`: the same bits).
    from eqrisk.model.window_kernel import window_kernel  # numba: imported by builds only

    ordered = np.ascontiguousarray(weights, dtype=np.float64)
    window_kernel(values, present, ordered, lo, hi, sums, count)
    return sums, count


def _log1p(r: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.log1p(r)
    return out


def descriptors(
    returns: np.ndarray,
    market: np.ndarray,
    cap: np.ndarray,
    turnover: np.ndarray | None,
    names: tuple[str, ...] = STYLE_NAMES,
    *,
    columns: slice | None = None,
) -> dict[str, np.ndarray]:
    """Raw descriptors (n x T, NaN = none) of each row at each session's close. `market` (n x T):
    each row's market factor return; `cap` (n x T); `turnover` (n x T, volume / shares) or None
    (no liquidity). `columns`: the sessions needed (the windows still read the ones before)."""
    out: dict[str, np.ndarray] = {}
    logr = _log1p(returns)
    both = np.isfinite(returns) & np.isfinite(market)
    rm = np.where(both, returns * market, np.nan)
    mm = np.where(both, market * market, np.nan)

    def ewm(x: np.ndarray, hl: float, length: int, lag: int = 0) -> tuple[np.ndarray, np.ndarray]:
        return window_sums(x, ewma_weights(hl, length), lag, columns=columns)

    with np.errstate(invalid="ignore", divide="ignore"):
        if "size" in names:
            out["size"] = np.log(np.where(cap > 0, cap, np.nan))
        if "momentum" in names:
            s, c = ewm(logr, 126.0, 504, lag=21)
            out["momentum"] = np.where(c >= 252, s, np.nan)
        if "beta" in names or "residual_volatility" in names:
            num, c = ewm(rm, 63.0, 252)
            den, _ = ewm(mm, 63.0, 252)
            out["beta"] = np.where((c >= 126) & (den > 0), num / den, np.nan)
        if "residual_volatility" in names:
            sq, c = ewm(returns * returns, 42.0, 252)
            w, _ = ewm(np.where(np.isfinite(returns), 1.0, np.nan), 42.0, 252)
            out["residual_volatility"] = np.where(c >= 63, np.sqrt(sq / w), np.nan)
        if "liquidity" in names:
            if turnover is None:
                out["liquidity"] = np.full(returns.shape, np.nan)
            else:
                ones = np.ones(1)
                parts = []
                for length, months in ((21, 1), (63, 3), (252, 12)):
                    s, c = window_sums(turnover, np.repeat(ones, length), columns=columns)
                    full = s / c * length  # the window's sum, missing days at the mean
                    parts.append(np.where(c >= length / 2, np.log(full / months), np.nan))
                out["liquidity"] = 0.35 * parts[0] + 0.35 * parts[1] + 0.3 * parts[2]
        if "reversal" in names:
            s, c = ewm(logr, 5.0, 21)
            out["reversal"] = np.where(c >= 10, s, np.nan)
    return {name: out[name] for name in names}


def standardise(x: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """One session's descriptor (n,) over the rows with a cap: cap-weighted mean 0, equal-
    weighted standard deviation 1, limited to +-LIMIT in rounds; 0 where the row
    has a cap but no descriptor, NaN where it has no cap (see the module docstring)."""
    has_cap = np.isfinite(cap) & (cap > 0)
    ok = has_cap & np.isfinite(x)
    out = np.where(has_cap, 0.0, np.nan)
    if ok.sum() < 2:
        return out
    v = x[ok]
    c = cap[ok]
    for _ in range(ROUNDS):
        v = v - np.sum(c * v) / np.sum(c)
        sd = float(np.std(v))
        if not sd > 0:
            return out
        v = v / sd
        if np.abs(v).max() <= LIMIT + TOLERANCE:
            break
        v = np.clip(v, -LIMIT, LIMIT)
    out[ok] = v
    return out


def orthogonalise(y: np.ndarray, on: list[np.ndarray], cap: np.ndarray) -> np.ndarray:
    """One session's standardised exposure (n,) made orthogonal (equal weights) to others,
    then standardised again; NaN rows stay NaN."""
    ok = np.isfinite(y)
    for z in on:
        ok &= np.isfinite(z)
    if ok.sum() <= len(on) + 1:
        return y
    a = np.column_stack([np.ones(int(ok.sum()))] + [z[ok] for z in on])
    coef, *_ = np.linalg.lstsq(a, y[ok], rcond=None)
    resid = np.where(ok, np.nan, y)
    resid[ok] = y[ok] - a @ coef
    return standardise(np.where(np.isfinite(y) & ~ok, 0.0, resid), cap)


def style_exposures(
    raw: dict[str, np.ndarray], cap: np.ndarray, stocks: np.ndarray, columns: range
) -> np.ndarray:
    """Standardised exposures (S x n x len(columns)) of the sessions `columns` (the descriptors
    and caps of those sessions' closes), over the rows `stocks` (n,) bool only (NaN elsewhere).
    Residual volatility is made orthogonal to size and beta, liquidity to size, where present."""
    names = list(raw)
    n = cap.shape[0]
    out = np.full((len(names), n, len(columns)), np.nan)
    for k, t in enumerate(columns):
        c = np.where(stocks, cap[:, t], np.nan)
        z = {name: standardise(raw[name][:, t], c) for name in names}
        if "residual_volatility" in z:
            base = [z[b] for b in ("size", "beta") if b in z]
            z["residual_volatility"] = orthogonalise(z["residual_volatility"], base, c)
        if "liquidity" in z and "size" in z and np.isfinite(raw["liquidity"][:, t]).any():
            z["liquidity"] = orthogonalise(z["liquidity"], [z["size"]], c)
        for s, name in enumerate(names):
            out[s, :, k] = z[name]
    return out
