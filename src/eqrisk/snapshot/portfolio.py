"""A portfolio's risk on a session of a snapshot: the stored risk model of that session
(`risk_days.risk_day`, read once and cached) and `model.portfolio_risk` on it, with the ETF hedge at a chosen level.

The HTTP layer never imports the model: the route calls `portfolio_answer` here and receives
plain numbers. The hedge at level L sells, per ETF of that level, the portfolio's exposure
through the L hedge ratios published on the previous session (what the portfolio page shows);
its volatility after is the risk model's volatility of the positions plus those ETF legs, so at
the model's level (L3) the hedged portfolio has no factor exposure and what is left is its
specific risk (where every factor is an ETF; a group portfolio cannot be traded).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from eqrisk.model.portfolio_risk import (
    Attribution,
    PortfolioRisk,
    portfolio_risk,
    resolve,
)
from eqrisk.model.risk_model import ANNUALIZATION, RiskModelDay
from eqrisk.snapshot.risk_days import day_level, risk_day
from eqrisk.snapshot.versions import Snapshot

__all__ = [
    "HedgeLegs",
    "PortfolioAnswer",
    "day_level",
    "market_only",
    "model_levels",
    "portfolio_answer",
    "risk_and_hedge",
    "risk_day",
]

LOW_USED_SHARE = 0.9
"""Below this share of the book's gross size used, the answer says that it describes part of
the book only (`PortfolioAnswer.used_share`)."""


@dataclass(frozen=True)
class HedgeLegs:
    level: int
    keys: list[str]
    notional: list[float]  # to buy (negative: sell) of each factor
    tradable: list[bool]
    vol_after: float
    exposure_after: list[float]  # each leg's factor exposure of positions + tradable legs
    # Euler split of vol_after by level: market, sector, subsector (what the legs leave: a group
    # portfolio, or the levels below the hedge's), style, specific; they add up to vol_after.
    after: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PortfolioAnswer:
    session: int
    risk: PortfolioRisk
    hedge: HedgeLegs
    used_share: float  # sum |w| of the positions used / sum |w| of all positions given
    levels: dict[str, int]  # ticker -> level of the model each used row was given (0 none)
    factor_rows: frozenset[str]  # the used tickers that are themselves factors of the model
    notes: list[str]  # what the answer's reader should know (a row modelled on SPY alone)

    @property
    def partial(self) -> bool:
        """Whether the model used less than `LOW_USED_SHARE` of the book."""
        return self.used_share < LOW_USED_SHARE


def _exposure(day: RiskModelDay, positions: Mapping[str, float], keys: list[str]) -> list[float]:
    """The factor exposure x = H'w of usable positions, per factor key (summed position by
    position, slot by slot)."""
    n = len(positions)
    rows = np.fromiter(map(day.row_of.get, positions, repeat(-1, n)), dtype=np.int64, count=n)
    w = np.fromiter(positions.values(), dtype=np.float64, count=n)
    ok = (rows >= 0) & np.isfinite(w)
    ok[ok] = day.usable[rows[ok]]
    idx = day.index[rows[ok]]
    terms = day.values[rows[ok]] * w[ok][:, None]
    has = idx >= 0
    x = np.zeros(len(day.factor_keys))
    np.add.at(x, idx[has], terms[has])
    where = {k: i for i, k in enumerate(day.factor_keys)}
    return [float(x[where[k]]) for k in keys]


LEVEL_MODELS = {
    0: "no exposures",
    1: "market factor only",
    2: "market and sector factors",
    3: "market, sector and subsector factors",
}
"""What each level of a row's exposures models it on (`model_level` of the answer)."""
FACTOR_MODEL = "a factor of the model itself (exposure 1, no specific risk)"


def model_levels(day: RiskModelDay, tickers: Iterable[str]) -> dict[str, int]:
    """The level of the exposures each known ticker has on the day's model: the deepest level
    its row really has (a stock without a subsector ETF: 2; a factor or an ETF: 1)."""
    row_of = day.row_of
    return {t: int(day.level[row_of[t]]) for t in tickers if t in row_of}


def market_only(
    levels: Mapping[str, int], factors: Iterable[str], asset_types: Mapping[str, str]
) -> list[str]:
    """The notes of the rows that are not stocks nor factors of the model (QQQ, TLT, GLD ...)
    and are modelled on the market factor alone: their sector or style content is specific
    risk to the model (docs/decisions/portfolio-risk.md)."""
    own = set(factors)
    out = []
    for ticker, lev in levels.items():
        kind = asset_types.get(ticker, "stock")
        if kind != "stock" and ticker not in own and lev == 1:
            article = "an" if kind[:1] in "aeiou" else "a"
            name = "ETF" if kind == "etf" else kind
            out.append(
                f"{ticker}: {article} {name} that is not a factor of the model, modelled on the "
                "market factor alone"
            )
    return out


def portfolio_answer(
    snap: Snapshot,
    t: int,
    positions: Mapping[str, float],
    *,
    benchmark: str | Mapping[str, float] | None = None,
    hedge_level: int = 3,
    asset_types: Mapping[str, str] | None = None,
) -> PortfolioAnswer:
    """The risk of `positions` on session t, its tracking error against `benchmark` (positions,
    or a ticker held for the net value of the positions used), and the ETF hedge at
    `hedge_level` with the volatility left after it, the level of the model each used row was
    given, and a note per row that is not a stock nor a factor (`asset_types`: ticker -> stock,
    etf or index; default the snapshot's). The day's model is the cached one (`risk_days`):
    O(positions x factors) arithmetic here."""
    day = risk_day(snap, t)
    at = day if hedge_level == day_level(snap) else risk_day(snap, t, level=hedge_level)
    risk, hedge = risk_and_hedge(day, at, positions, benchmark, hedge_level)
    gross = float(np.abs(np.fromiter(positions.values(), dtype=np.float64)).sum())
    used_gross = float(np.abs(risk.portfolio.positions.weights).sum())
    rows_used = list(risk.portfolio.positions.tickers)
    if risk.active is not None:
        rows_used += [t for t in risk.active.positions.tickers if t not in set(rows_used)]
    levels = model_levels(day, rows_used)
    if asset_types is None:
        symbols = snap.index.symbols
        asset_types = {t: symbols[t].asset_type for t in levels if t in symbols}
    factor_rows = frozenset(levels) & frozenset(day.factor_keys)
    return PortfolioAnswer(
        session=t,
        risk=risk,
        hedge=hedge,
        used_share=used_gross / gross if gross > 0.0 and np.isfinite(gross) else 0.0,
        levels=levels,
        factor_rows=factor_rows,
        notes=market_only(levels, day.factor_keys, asset_types),
    )


def risk_and_hedge(
    day: RiskModelDay,
    at: RiskModelDay,
    positions: Mapping[str, float],
    benchmark: str | Mapping[str, float] | None,
    hedge_level: int,
) -> tuple[PortfolioRisk, HedgeLegs]:
    """The route's arithmetic on a session's model `day`: the risk of `positions` (with the
    tracking error against `benchmark`) and the ETF hedge at `hedge_level` from the model `at`
    of that level (`day` itself at the model's level)."""
    if isinstance(benchmark, str):
        benchmark = {benchmark: float(resolve(day, positions).weights.sum())}
    risk = portfolio_risk(day, positions, benchmark=benchmark)
    return risk, _hedge(day, at, risk, positions, hedge_level)


def _hedge(
    day: RiskModelDay,
    at: RiskModelDay,
    risk: PortfolioRisk,
    positions: Mapping[str, float],
    level: int,
) -> HedgeLegs:
    """The ETF hedge at `level` (the model `at`) and what is left after it: the legs the
    universe trades added to the positions, the unusable rows left out, on the day's model."""
    legs = risk.hedge if at is day else portfolio_risk(at, positions).hedge
    hedged = dict(positions)
    universe = day.row_of
    for key, notional, ok in zip(legs.keys, legs.notional.tolist(), legs.tradable, strict=True):
        if ok and key in universe:
            hedged[key] = hedged.get(key, 0.0) + notional
    unusable = set(risk.unusable.tickers)
    used = {k: v for k, v in hedged.items() if k not in unusable} if unusable else hedged
    hedged_risk = portfolio_risk(day, used).portfolio if used else None
    after = hedged_risk.vol if hedged_risk is not None else 0.0
    split = dict(hedged_risk.by_level) if hedged_risk is not None else {}
    tradable = [ok and key in universe for key, ok in zip(legs.keys, legs.tradable, strict=True)]
    if at is day and hedged_risk is not None:  # the hedged book's own x = H'w, same sums
        f = hedged_risk.factors
        x = dict(zip(f.keys, f.exposure.tolist(), strict=True))
        exposure_after = [x.get(key, 0.0) for key in legs.keys]
    else:
        exposure_after = _exposure(at, used, legs.keys)
    return HedgeLegs(
        level=level,
        keys=legs.keys,
        notional=legs.notional.tolist(),
        tradable=tradable,
        vol_after=after,
        exposure_after=exposure_after,
        after=split,
    )


def model_of(ticker: str, level: int, factor_rows: frozenset[str]) -> str:
    """What a row's `model_level` means, in words."""
    return FACTOR_MODEL if ticker in factor_rows else LEVEL_MODELS[level]


def attribution_dict(
    a: Attribution,
    levels: Mapping[str, int] | None = None,
    factor_rows: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """An attribution as plain JSON-ready numbers (with `levels`, each position's
    `model_level` and `model`)."""
    lv = levels or {}
    f, p = a.factors, a.positions
    return {
        "vol_daily": a.vol,
        "vol_annual": a.vol_annual,
        "factor_vol_daily": a.factor_vol,
        "style_vol_daily": a.style_vol,
        "specific_vol_daily": a.specific_vol,
        "by_level": dict(a.by_level),
        "factors": [
            {
                "factor": f.keys[i],
                "level": f.levels[i],
                "exposure": float(f.exposure[i]),
                "marginal": float(f.marginal[i]),
                "contribution": float(f.contribution[i]),
                "share": float(f.share[i]),
            }
            for i in range(len(f.keys))
        ],
        "positions": [
            {
                "ticker": p.tickers[i],
                "position": float(p.weights[i]),
                "marginal": float(p.marginal[i]),
                "contribution": float(p.contribution[i]),
                "share": float(p.share[i]),
                **(
                    {}
                    if levels is None
                    else {
                        "model_level": lv.get(p.tickers[i], 0),
                        "model": model_of(p.tickers[i], lv.get(p.tickers[i], 0), factor_rows),
                    }
                ),
            }
            for i in range(len(p.tickers))
        ],
    }


ANNUAL = float(ANNUALIZATION)
