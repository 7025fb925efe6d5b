"""A portfolio's risk on one session of the risk model: predicted volatility, tracking error,
the factor / specific split, Euler contributions (per level, per factor, per position), and the
ETF hedge with the volatility left after it. Pure: a `RiskModelDay` and positions in, numbers
out, in O(N K + K^2) through the factor structure (never the N x N covariance).

Positions are weights or dollars, shorts allowed; every figure is in the units of the
positions (a weight portfolio's volatility is a fraction, a dollar portfolio's is dollars).
With w the positions, H the exposures, F the factor covariance and D the specific variances:
x = H'w, variance = x'Fx + sum w_i^2 D_i, and Euler's theorem splits the volatility s exactly:
position i contributes w_i (H F x + D w)_i / s, factor k contributes x_k (F x)_k / s, the
specific part sum w_i^2 D_i / s. With the second layer (`RiskModelDay.style`), H holds each
stock's style exposures beside its ETF ones and x and F run over both layers; the style
factors are a level of their own ("style"). The hedge sells x_k of each ETF factor only (what
a user can trade): what is left is the style part and the specific part.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import overload

import numpy as np

from eqrisk.model.risk_model import ANNUALIZATION, LEVEL_NAMES, STYLE_LEVEL, RiskModelDay

LEVELS = (*LEVEL_NAMES, "style")  # by factor_level - 1; STYLE_LEVEL is the fourth
assert LEVELS[STYLE_LEVEL - 1] == "style"

NOT_IN_UNIVERSE = "not in the model's universe"


@dataclass
class Unusable:
    """A ticker the answer could not use, and why."""

    ticker: str
    reason: str


class Unusables(Sequence[Unusable]):
    """The tickers an answer could not use, with why: two lists, not an object per ticker (a
    book may name thousands of unknown tickers; objects would cost their construction and the
    garbage collector's passes over them). Reads as a sequence of `Unusable`; `as_json()` is
    the answer's `[{"ticker", "reason"}]`."""

    __slots__ = ("reasons", "tickers")

    def __init__(self, tickers: list[str] | None = None, reasons: list[str] | None = None):
        self.tickers: list[str] = tickers or []
        self.reasons: list[str] = reasons or []
        if len(self.tickers) != len(self.reasons):
            raise ValueError("one reason per ticker")

    def __len__(self) -> int:
        return len(self.tickers)

    @overload
    def __getitem__(self, i: int) -> Unusable: ...
    @overload
    def __getitem__(self, i: slice) -> list[Unusable]: ...
    def __getitem__(self, i: int | slice) -> Unusable | list[Unusable]:
        if isinstance(i, slice):
            return list(map(Unusable, self.tickers[i], self.reasons[i]))
        return Unusable(self.tickers[i], self.reasons[i])

    def __iter__(self) -> Iterator[Unusable]:
        return map(Unusable, self.tickers, self.reasons)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Unusables):
            return self.tickers == other.tickers and self.reasons == other.reasons
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Unusables({list(self)!r})"

    def as_json(self) -> list[dict[str, str]]:
        """`[{"ticker", "reason"}]`: dicts of strings, which the collector does not track."""
        return [{"ticker": t, "reason": r} for t, r in zip(self.tickers, self.reasons, strict=True)]


@dataclass(frozen=True)
class Positions:
    """Positions resolved against the model's rows (the usable ones only)."""

    tickers: list[str]
    rows: np.ndarray  # (m,) row of each in the model day
    weights: np.ndarray  # (m,)
    unusable: Unusables


@dataclass(frozen=True)
class FactorBreakdown:
    """Per factor the portfolio is exposed to (in the model's factor order)."""

    keys: list[str]
    levels: list[str]  # market, sector, subsector or style
    exposure: np.ndarray  # x_k: the portfolio's exposure (units of the positions)
    marginal: np.ndarray  # d vol / d x_k = (F x)_k / vol
    contribution: np.ndarray  # x_k (F x)_k / vol
    share: np.ndarray  # contribution / vol


@dataclass(frozen=True)
class PositionBreakdown:
    tickers: list[str]
    weights: np.ndarray
    marginal: np.ndarray  # d vol / d w_i
    contribution: np.ndarray  # w_i d vol / d w_i
    share: np.ndarray
    rows: np.ndarray | None = None  # each position's row in the model day


@dataclass(frozen=True)
class Attribution:
    """The risk of one set of positions, with its Euler split."""

    vol: float  # daily
    vol_annual: float
    factor_vol: float  # sqrt(x'Fx), both layers
    specific_vol: float  # sqrt(sum w^2 D)
    by_level: dict[str, float]  # market, sector, subsector, style, specific: contributions
    factors: FactorBreakdown
    positions: PositionBreakdown
    style_vol: float = 0.0  # sqrt(x_s' F_ss x_s): the second layer's factors alone


@dataclass(frozen=True)
class Hedge:
    """The ETF hedge at the model's level: sell `notional` of each factor (a negative notional
    is a purchase); `tradable` is False for a group portfolio (no ETF in the data)."""

    keys: list[str]
    notional: np.ndarray
    tradable: list[bool]
    vol_after: float  # what the ETF legs leave: the style and the specific risk
    vol_after_annual: float


@dataclass(frozen=True)
class PortfolioRisk:
    session: int
    portfolio: Attribution
    active: Attribution | None  # positions less the benchmark: its vol is the tracking error
    hedge: Hedge
    unusable: Unusables
    benchmark_unusable: Unusables

    @property
    def tracking_error(self) -> float | None:
        return None if self.active is None else self.active.vol


def resolve(day: RiskModelDay, positions: Mapping[str, float]) -> Positions:
    """The positions the model can use, and the others with why. No Python loop per position
    (a book and its benchmark may name thousands): the lookups are `map` over the day's dict,
    the selections `itertools.compress`; only a known ticker the model cannot use is looked at
    on its own, for its reason."""
    tickers = list(positions)
    n = len(tickers)
    rows = np.fromiter(map(day.row_of.get, tickers, repeat(-1, n)), dtype=np.int64, count=n)
    weights = np.fromiter(positions.values(), dtype=np.float64, count=n)
    known = rows >= 0
    ok = known & np.isfinite(weights) & (weights != 0.0)
    ok[ok] = day.usable[rows[ok]]
    if ok.all():  # every position used (the usual book): no copies
        return Positions(tickers, rows, weights, Unusables())
    bad = ~ok
    names = list(compress(tickers, bad.tolist()))
    reasons = [NOT_IN_UNIVERSE] * len(names)
    at = np.flatnonzero(bad)
    problems = day.problems
    for j in np.flatnonzero(known[at]).tolist():  # known but not usable: few
        i = int(at[j])
        w = float(weights[i])
        if not np.isfinite(w):
            reasons[j] = "position is not a finite number"
        elif w == 0.0:
            reasons[j] = "position is zero"
        else:
            reasons[j] = problems[int(rows[i])] or "no forecast"
    return Positions(
        list(compress(tickers, ok.tolist())), rows[ok], weights[ok], Unusables(names, reasons)
    )


def _style_factors(day: RiskModelDay) -> np.ndarray:
    """The second-layer factors with a covariance this session (rows of `day.cov`)."""
    if day.style is None:
        return np.zeros(0, dtype=np.int64)
    k0 = day.n_etf
    return np.flatnonzero(day.served[k0:]) + k0


def attribution(day: RiskModelDay, pos: Positions) -> Attribution:
    """Volatility and its Euler split for resolved positions (see the module docstring)."""
    idx = day.index[pos.rows]
    values = day.values[pos.rows]
    val = values * pos.weights[:, None]
    has = idx >= 0
    k = len(day.factor_keys)
    # The ETF factors the positions are exposed to, in factor order, and x over all K (each
    # factor's terms summed in the positions' order): counts over K, not a sort of N x 3 slots.
    slots = idx[has]
    etf = np.flatnonzero(np.bincount(slots, minlength=k))
    x_etf = np.bincount(slots, weights=val[has], minlength=k)[etf]
    styles = _style_factors(day)
    if day.style is None:
        h_style = np.zeros((len(pos.rows), 0))
    elif len(styles) == day.style.shape[1]:  # every style factor served: whole rows
        h_style = day.style[pos.rows]
    else:
        h_style = day.style[np.ix_(pos.rows, styles - day.n_etf)]
    factors = np.concatenate([etf, styles])
    x = np.concatenate([x_etf, pos.weights @ h_style])
    fx = day.cov[np.ix_(factors, factors)] @ x
    factor_var = float(x @ fx)
    d = day.specific_var[pos.rows]
    spec_terms = pos.weights * d
    spec_var = float(pos.weights @ spec_terms)
    var = factor_var + spec_var
    vol = float(np.sqrt(var)) if var > 0.0 else 0.0
    inv = 1.0 / vol if vol > 0.0 else 0.0
    fx_all = np.zeros(k)  # (F x)_k by factor row, 0 for a factor the positions miss
    fx_all[etf] = fx[: len(etf)]
    through = np.where(has, values * fx_all[np.where(has, idx, 0)], 0.0).sum(axis=1)
    through += h_style @ fx[len(etf) :]
    marginal = (through + spec_terms) * inv
    contribution = pos.weights * marginal
    f_contrib = x * fx * inv
    level_of = day.factor_level[factors]
    per_level = np.bincount(level_of - 1, weights=f_contrib, minlength=len(LEVELS))
    by_level = {name: float(per_level[j]) for j, name in enumerate(LEVELS)}
    by_level["specific"] = spec_var * inv
    x_s = x[len(etf) :]
    style_var = float(x_s @ day.cov[np.ix_(styles, styles)] @ x_s) if len(styles) else 0.0
    return Attribution(
        vol=vol,
        vol_annual=vol * float(ANNUALIZATION),
        factor_vol=float(np.sqrt(max(factor_var, 0.0))),
        specific_vol=float(np.sqrt(spec_var)),
        by_level=by_level,
        style_vol=float(np.sqrt(max(style_var, 0.0))),
        factors=FactorBreakdown(
            keys=[day.factor_keys[k] for k in factors.tolist()],
            levels=[LEVELS[lv - 1] for lv in level_of.tolist()],
            exposure=x,
            marginal=fx * inv,
            contribution=f_contrib,
            share=f_contrib * inv,
        ),
        positions=PositionBreakdown(
            tickers=pos.tickers,
            weights=pos.weights,
            marginal=marginal,
            contribution=contribution,
            share=contribution * inv,
            rows=pos.rows,
        ),
    )


def _active(portfolio: Positions, benchmark: Positions) -> Positions:
    """Positions less the benchmark, row by row (a row in either)."""
    rows = np.concatenate([portfolio.rows, benchmark.rows])
    weights = np.concatenate([portfolio.weights, -benchmark.weights])
    tickers = portfolio.tickers + benchmark.tickers
    unique, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    net = np.bincount(inverse.ravel(), weights=weights, minlength=len(unique))
    return Positions(list(map(tickers.__getitem__, first.tolist())), unique, net, Unusables())


def portfolio_risk(
    day: RiskModelDay,
    positions: Mapping[str, float],
    *,
    benchmark: Mapping[str, float] | None = None,
) -> PortfolioRisk:
    """The risk of `positions` (ticker -> weight or dollars) on the model's session, with the
    tracking error against `benchmark` (ticker -> weight, same units) when given."""
    bench = None if benchmark is None else resolve(day, benchmark)
    return risk_of(day, resolve(day, positions), bench)


def risk_of(day: RiskModelDay, pos: Positions, bench: Positions | None = None) -> PortfolioRisk:
    """`portfolio_risk` of positions already resolved (`resolve`) on `day`, with the tracking
    error against the resolved benchmark `bench` when given."""
    portfolio = attribution(day, pos)
    active = None
    bench_unusable = Unusables()
    if bench is not None:
        bench_unusable = bench.unusable
        active = attribution(day, _active(pos, bench))
    f = portfolio.factors
    etf = [lv != "style" for lv in f.levels]
    keys = [k for k, ok in zip(f.keys, etf, strict=True) if ok]
    after = float(np.sqrt(portfolio.style_vol**2 + portfolio.specific_vol**2))
    return PortfolioRisk(
        session=day.session,
        portfolio=portfolio,
        active=active,
        hedge=Hedge(
            keys=keys,
            notional=-f.exposure[np.asarray(etf, dtype=bool)],
            tradable=[not k.startswith("group:") for k in keys],
            vol_after=after,
            vol_after_annual=after * float(ANNUALIZATION),
        ),
        unusable=pos.unusable,
        benchmark_unusable=bench_unusable,
    )
