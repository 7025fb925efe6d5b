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


def _bounds(columns: slice | None, n_t: int) -> tuple[int, int]:
    return (0, n_t) if columns is None else (columns.start or 0, columns.stop or n_t)


def _window(
    x: np.ndarray,
    halflife: float,
    length: int,
    lag: int,
    lo: int,
    hi: int,
    *,
    y: np.ndarray | None = None,
    series: str = "x",
    sums: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts (n x (hi - lo)) of `window_sums`'s columns lo .. hi - 1, of x or of
    a product of x and y (`window_kernel.MODES`); the sums into `sums` where given (C-ordered,
    every cell written)."""
    # Column t's window: columns t - lag - length + 1 .. t - lag, each window's sum in an order
    # of its own (`window_kernel`).
    from eqrisk.model.window_kernel import MODES, factors, window_kernel  # numba: builds only

    c, d, w = factors(halflife, length)
    if sums is None:
        sums = np.empty((x.shape[0], max(hi - lo, 0)))
    count = np.empty(sums.shape)
    values = np.ascontiguousarray(x, dtype=np.float64)
    other = values if y is None else np.ascontiguousarray(y, dtype=np.float64)
    window_kernel(values, other, MODES[series], c, d, w, lag, lo, hi, sums, count)
    return sums, count


def window_sums(
    x: np.ndarray, halflife: float, length: int, lag: int = 0, *, columns: slice | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per row and column t: sum of `ewma_weights(halflife, length)` * x over the window of
    `length` sessions ending at t - lag (oldest first; `halflife` inf: flat weights), missing
    values skipped, and the number of values present. Columns whose window starts before
    column 0 use what there is. `columns`: the columns to compute (default all); others are
    NaN and 0. A window's sum depends on its own values only (`window_kernel`)."""
    n, n_t = x.shape
    lo, hi = _bounds(columns, n_t)
    sums = np.full((n, n_t), np.nan)
    count = np.zeros((n, n_t))
    sums[:, lo:hi], count[:, lo:hi] = _window(x, halflife, length, lag, lo, hi)
    return sums, count


def _log1p(r: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.log1p(r)
    return out


def _liquidity(turnover: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """0.35 / 0.35 / 0.3 of the log monthly turnover over 21, 63 and 252 sessions."""
    parts = []
    for length, months in ((21, 1), (63, 3), (252, 12)):
        s, c = _window(turnover, np.inf, length, 0, lo, hi)
        full = s / c * length  # the window's sum, missing days at the mean
        parts.append(np.where(c >= length / 2, np.log(full / months), np.nan))
    out: np.ndarray = 0.35 * parts[0] + 0.35 * parts[1] + 0.3 * parts[2]
    return out


def _beta_and_volatility(
    returns: np.ndarray,
    market: np.ndarray,
    names: tuple[str, ...],
    lo: int,
    hi: int,
    row: dict[str, np.ndarray],
) -> None:
    """Beta and residual volatility (those of `names`) into their rows of the block."""
    # sum w r m / sum w m^2 over the days both exist
    if "beta" in names:
        num, c = _window(returns, 63.0, 252, 0, lo, hi, y=market, series="xy")
        den, _ = _window(returns, 63.0, 252, 0, lo, hi, y=market, series="yy")
        np.divide(num, den, out=row["beta"])
        np.copyto(row["beta"], np.nan, where=~((c >= 126) & (den > 0)))
    if "residual_volatility" in names:  # sum w r^2 / sum w over the days r exists
        sq, c = _window(returns, 42.0, 252, 0, lo, hi, series="xx")
        w, _ = _window(returns, 42.0, 252, 0, lo, hi, series="present")
        rv = row["residual_volatility"]
        np.divide(sq, w, out=rv)
        np.sqrt(rv, out=rv)
        np.copyto(rv, np.nan, where=~(c >= 63))


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
    (no liquidity). `columns`: the sessions needed (the windows still read the ones before;
    the other sessions are NaN)."""
    n, n_t = returns.shape
    lo, hi = _bounds(columns, n_t)
    block = descriptor_block(returns, market, cap, turnover, names, columns=columns)
    out: dict[str, np.ndarray] = {}
    for s, name in enumerate(names):
        out[name] = np.empty((n, n_t))
        out[name][:, :lo] = np.nan
        out[name][:, hi:] = np.nan
        out[name][:, lo:hi] = block[s]
    return out


def descriptor_block(
    returns: np.ndarray,
    market: np.ndarray,
    cap: np.ndarray,
    turnover: np.ndarray | None,
    names: tuple[str, ...] = STYLE_NAMES,
    *,
    columns: slice | None = None,
) -> np.ndarray:
    """`descriptors`' sessions `columns` only, as one block (len(names) x n x their number, in
    the order of `names`): what a run that needs a few sessions of a long history keeps. Each
    descriptor is written into its row of the block (no stacking copy)."""
    n, n_t = returns.shape
    lo, hi = _bounds(columns, n_t)
    block = np.empty((len(names), n, max(hi - lo, 0)))
    row = {name: block[s] for s, name in enumerate(names)}
    logr = _log1p(returns) if {"momentum", "reversal"} & set(names) else returns
    with np.errstate(invalid="ignore", divide="ignore"):
        if "size" in names:
            np.log(np.where(cap[:, lo:hi] > 0, cap[:, lo:hi], np.nan), out=row["size"])
        if "momentum" in names:
            _, c = _window(logr, 126.0, 504, 21, lo, hi, sums=row["momentum"])
            np.copyto(row["momentum"], np.nan, where=~(c >= 252))
        if "beta" in names or "residual_volatility" in names:
            _beta_and_volatility(returns, market, names, lo, hi, row)
        if "liquidity" in names:
            if turnover is None:
                row["liquidity"][...] = np.nan
            else:
                row["liquidity"][...] = _liquidity(turnover, lo, hi)
        if "reversal" in names:
            _, c = _window(logr, 5.0, 21, 0, lo, hi, sums=row["reversal"])
            np.copyto(row["reversal"], np.nan, where=~(c >= 10))
    return block


def _kernel_args(names: list[str]) -> tuple[int, np.ndarray, int, np.ndarray]:
    """The rows of the stacked descriptors to make orthogonal, and to what (-1: none)."""
    idx = {name: s for s, name in enumerate(names)}
    rv = idx.get("residual_volatility", -1)
    rv_on = np.asarray([idx[b] for b in ("size", "beta") if b in idx], dtype=np.int64)
    liq = idx["liquidity"] if "liquidity" in idx and "size" in idx else -1
    liq_on = np.asarray([idx["size"]] if liq >= 0 else [], dtype=np.int64)
    return rv, rv_on, liq, liq_on


def _standardised(
    raw: np.ndarray,
    cap: np.ndarray,
    stocks: np.ndarray,
    names: list[str],
    liq_any: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """`style_kernel.exposure_kernel` over raw (S x n x K) and cap (n x K), into `out` (S x n x
    K, a view may do) where given: the kernel writes every cell of it."""
    from eqrisk.model.style_kernel import exposure_kernel  # numba: imported by builds only

    if out is None:
        out = np.empty(raw.shape)
    rv, rv_on, liq, liq_on = _kernel_args(names)
    exposure_kernel(
        np.ascontiguousarray(raw, dtype=np.float64), np.ascontiguousarray(cap, dtype=np.float64),
        np.ascontiguousarray(stocks, dtype=np.bool_), rv, rv_on, liq, liq_on,
        np.ascontiguousarray(liq_any, dtype=np.bool_), ROUNDS, LIMIT, LIMIT + TOLERANCE, out,
    )  # fmt: skip
    return out


def standardise(x: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """One session's descriptor (n,) over the rows with a cap: cap-weighted mean 0, equal-
    weighted standard deviation 1, limited to +-LIMIT in rounds; 0 where the row
    has a cap but no descriptor, NaN where it has no cap (see the module docstring)."""
    n = len(x)
    stocks = np.ones(n, dtype=np.bool_)
    z = _standardised(x.reshape(1, n, 1), cap.reshape(n, 1), stocks, ["x"], np.zeros(1, bool))
    return z[0, :, 0]


def style_exposures(
    raw: dict[str, np.ndarray], cap: np.ndarray, stocks: np.ndarray, columns: range
) -> np.ndarray:
    """Standardised exposures (S x n x len(columns)) of the sessions `columns` (the descriptors
    and caps of those sessions' closes), over the rows `stocks` (n,) bool only (NaN elsewhere).
    Residual volatility is made orthogonal to size and beta (the residual of an equal-weight
    cross-sectional regression on an intercept and them), liquidity to size, where present
    (liquidity in the sessions where some row has the descriptor), each standardised again.
    All the sessions at once (`style_kernel`)."""
    cols = np.asarray(columns, dtype=np.int64)
    return exposures_of({name: x[:, cols] for name, x in raw.items()}, cap[:, cols], stocks)


def exposures_of(raw: dict[str, np.ndarray], cap: np.ndarray, stocks: np.ndarray) -> np.ndarray:
    """`style_exposures` of the sessions of `raw` (n x K each: rows of `descriptor_block`) and
    `cap` (n x K, the same sessions')."""
    names = list(raw)
    if not names:
        return np.full((0, *cap.shape), np.nan)
    return block_exposures(np.stack([raw[name] for name in names]), names, cap, stocks)


def block_exposures(
    block: np.ndarray,
    names: list[str],
    cap: np.ndarray,
    stocks: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """`exposures_of` of the descriptors as one block (S x n x K: `descriptor_block`), into
    `out` (S x n x K) where given."""
    if "liquidity" in names:
        liq_any = np.isfinite(block[names.index("liquidity")]).any(axis=0)
    else:
        liq_any = np.zeros(cap.shape[1], bool)
    return _standardised(block, cap, stocks, names, liq_any, out)
