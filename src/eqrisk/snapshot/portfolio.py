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
from itertools import compress, repeat
from typing import Any

import numpy as np

from eqrisk.model.portfolio_risk import (
    Attribution,
    PortfolioRisk,
    Positions,
    Unusables,
    attribution,
    portfolio_risk,
    resolve,
    risk_of,
)
from eqrisk.model.risk_model import ANNUALIZATION, RiskModelDay
from eqrisk.snapshot.risk_days import day_level, risk_day
from eqrisk.snapshot.versions import Snapshot

__all__ = [
    "Attribution",
    "HedgeLegs",
    "PortfolioAnswer",
    "Unusables",
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
    row_level: np.ndarray  # (rows of the model day,) the level of the model each row is given
    factor_row_index: np.ndarray  # the model day's rows that are themselves factors of it
    notes: list[str]  # what the answer's reader should know (a row modelled on SPY alone)

    @property
    def partial(self) -> bool:
        """Whether the model used less than `LOW_USED_SHARE` of the book."""
        return self.used_share < LOW_USED_SHARE

    def model_levels(self, a: Attribution) -> np.ndarray:
        """The level of the model each position of `a` was given (0 none), row by row."""
        rows = a.positions.rows
        assert rows is not None, "an attribution of the answer's day carries its rows"
        levels: np.ndarray = self.row_level[rows].astype(np.int64)
        return levels

    def is_factor(self, a: Attribution) -> np.ndarray:
        """Whether each position of `a` is itself a factor of the model (exposure 1)."""
        rows = a.positions.rows
        assert rows is not None, "an attribution of the answer's day carries its rows"
        return np.isin(rows, self.factor_row_index)

    @property
    def levels(self) -> dict[str, int]:
        """Ticker -> the level of the model of each row used (the book's, then the other rows
        of the tracking error's)."""
        out = self._levels_of(self.risk.portfolio)
        if self.risk.active is not None:
            for ticker, level in self._levels_of(self.risk.active).items():
                out.setdefault(ticker, level)
        return out

    def _levels_of(self, a: Attribution) -> dict[str, int]:
        return dict(zip(a.positions.tickers, self.model_levels(a).tolist(), strict=True))


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
    O(positions x factors) arithmetic here, in numpy (no Python step per position)."""
    day = risk_day(snap, t)
    at = day if hedge_level == day_level(snap) else risk_day(snap, t, level=hedge_level)
    risk, hedge = risk_and_hedge(day, at, positions, benchmark, hedge_level)
    n = len(positions)
    gross = float(np.abs(np.fromiter(positions.values(), dtype=np.float64, count=n)).sum())
    used_gross = float(np.abs(risk.portfolio.positions.weights).sum())
    row_of = day.row_of
    factor_rows = np.array([row_of[k] for k in day.factor_keys if k in row_of], dtype=np.int64)
    return PortfolioAnswer(
        session=t,
        risk=risk,
        hedge=hedge,
        used_share=used_gross / gross if gross > 0.0 and np.isfinite(gross) else 0.0,
        row_level=day.level,
        factor_row_index=factor_rows,
        notes=_notes(snap, day, risk, factor_rows, asset_types),
    )


def _notes(
    snap: Snapshot,
    day: RiskModelDay,
    risk: PortfolioRisk,
    factor_rows: np.ndarray,
    asset_types: Mapping[str, str] | None,
) -> list[str]:
    """`market_only` of the rows used (the book's, then the other rows of the tracking
    error's): only the rows at level 1 that are not factors can be such a row, so only those
    are looked up."""
    parts = [(risk.portfolio.positions.tickers, risk.portfolio.positions.rows)]
    if risk.active is not None:
        held = risk.portfolio.positions.rows
        others = risk.active.positions
        assert others.rows is not None and held is not None
        extra = ~np.isin(others.rows, held)
        parts.append((list(compress(others.tickers, extra.tolist())), others.rows[extra]))
    candidates: dict[str, int] = {}
    for tickers, rows in parts:
        assert rows is not None
        maybe = (day.level[rows] == 1) & ~np.isin(rows, factor_rows)
        for ticker in compress(tickers, maybe.tolist()):
            candidates.setdefault(ticker, 1)
    if not candidates:
        return []
    if asset_types is None:
        symbols = snap.index.symbols
        asset_types = {t: symbols[t].asset_type for t in candidates if t in symbols}
    return market_only(candidates, day.factor_keys, asset_types)


def risk_and_hedge(
    day: RiskModelDay,
    at: RiskModelDay,
    positions: Mapping[str, float],
    benchmark: str | Mapping[str, float] | None,
    hedge_level: int,
) -> tuple[PortfolioRisk, HedgeLegs]:
    """The route's arithmetic on a session's model `day`: the risk of `positions` (with the
    tracking error against `benchmark`) and the ETF hedge at `hedge_level` from the model `at`
    of that level (`day` itself at the model's level). Each book is resolved once."""
    pos = resolve(day, positions)
    if isinstance(benchmark, str):
        benchmark = {benchmark: float(pos.weights.sum())}
    risk = risk_of(day, pos, None if benchmark is None else resolve(day, benchmark))
    return risk, _hedge_of(day, at, risk, pos, positions, hedge_level)


def _hedged_book(
    day: RiskModelDay, pos: Positions, positions: Mapping[str, float], add: list[tuple[str, float]]
) -> Positions:
    """The positions used plus the ETF legs `add` (ticker, notional), as the dict of the
    positions given with each leg added to its ticker, less the tickers the book could not use,
    would resolve: a leg on a ticker of the book adds to its position (a ticker given but not
    usable stays out), another leg is a row of its own after the book's, and a row whose
    position is zero, or that has no forecast, is left out."""
    weights = pos.weights.copy()
    tickers, rows = list(pos.tickers), [pos.rows]
    new_w: list[float] = []
    for key, notional in add:
        row = day.row_of[key]
        if key in positions:
            found = np.flatnonzero(pos.rows == row)
            if len(found):
                weights[found[0]] += notional
        else:
            tickers.append(key)
            rows.append(np.array([row], dtype=np.int64))
            new_w.append(notional)
    all_rows = np.concatenate(rows)
    all_w = np.concatenate([weights, np.array(new_w, dtype=np.float64)])
    keep = (all_w != 0.0) & np.isfinite(all_w) & day.usable[all_rows]
    if keep.all():
        return Positions(tickers, all_rows, all_w, pos.unusable)
    return Positions(
        list(compress(tickers, keep.tolist())), all_rows[keep], all_w[keep], pos.unusable
    )


def _hedge(
    day: RiskModelDay,
    at: RiskModelDay,
    risk: PortfolioRisk,
    positions: Mapping[str, float],
    level: int,
) -> HedgeLegs:
    """The ETF hedge at `level` (the model `at`) and what is left after it: the legs the
    universe trades added to the positions, the unusable rows left out, on the day's model."""
    return _hedge_of(day, at, risk, resolve(day, positions), positions, level)


def _hedge_of(
    day: RiskModelDay,
    at: RiskModelDay,
    risk: PortfolioRisk,
    pos: Positions,
    positions: Mapping[str, float],
    level: int,
) -> HedgeLegs:
    """`_hedge` of the positions `pos` already resolved on `day`."""
    legs = risk.hedge if at is day else portfolio_risk(at, positions).hedge
    universe = day.row_of
    tradable = [ok and key in universe for key, ok in zip(legs.keys, legs.tradable, strict=True)]
    add = [
        (key, notional)
        for key, notional, ok in zip(legs.keys, legs.notional.tolist(), tradable, strict=True)
        if ok
    ]
    hedged = _hedged_book(day, pos, positions, add)
    any_row = len(pos.tickers) > 0 or any(key not in positions for key, _ in add)
    hedged_risk = attribution(day, hedged) if any_row else None
    after = hedged_risk.vol if hedged_risk is not None else 0.0
    split = dict(hedged_risk.by_level) if hedged_risk is not None else {}
    if at is day and hedged_risk is not None:  # the hedged book's own x = H'w, same sums
        f = hedged_risk.factors
        x = dict(zip(f.keys, f.exposure.tolist(), strict=True))
        exposure_after = [x.get(key, 0.0) for key in legs.keys]
    else:
        exposure_after = _exposure(at, _used_dict(positions, risk, add), legs.keys)
    return HedgeLegs(
        level=level,
        keys=legs.keys,
        notional=legs.notional.tolist(),
        tradable=tradable,
        vol_after=after,
        exposure_after=exposure_after,
        after=split,
    )


def _used_dict(
    positions: Mapping[str, float], risk: PortfolioRisk, add: list[tuple[str, float]]
) -> dict[str, float]:
    """The positions given plus the legs, less the tickers the book could not use (a hedge at
    another level than the model's: exposures of that level's model)."""
    hedged = dict(positions)
    for key, notional in add:
        hedged[key] = hedged.get(key, 0.0) + notional
    unusable = set(risk.unusable.tickers)
    return {k: v for k, v in hedged.items() if k not in unusable} if unusable else hedged


def model_of(ticker: str, level: int, factor_rows: frozenset[str]) -> str:
    """What a row's `model_level` means, in words."""
    return FACTOR_MODEL if ticker in factor_rows else LEVEL_MODELS[level]


def position_rows(a: Attribution, answer: PortfolioAnswer | None = None) -> list[dict[str, Any]]:
    """The positions of an attribution as JSON-ready rows (ticker, position, marginal,
    contribution, share, and with `answer` each one's `model_level` and `model`): each field
    taken out of its array in one `tolist`, each row one dict display (a book holds up to
    5,000 positions; indexing the arrays row by row cost several times more)."""
    p = a.positions
    numbers = (p.weights.tolist(), p.marginal.tolist(), p.contribution.tolist(), p.share.tolist())
    if answer is None:
        return [
            {"ticker": t, "position": w, "marginal": m, "contribution": c, "share": s}
            for t, w, m, c, s in zip(p.tickers, *numbers, strict=True)
        ]
    level, code = model_codes(a, answer)
    model = list(map(MODEL_TEXTS.__getitem__, code.tolist()))
    return [
        {
            "ticker": t,
            "position": w,
            "marginal": m,
            "contribution": c,
            "share": s,
            "model_level": lv,
            "model": md,
        }
        for t, w, m, c, s, lv, md in zip(p.tickers, *numbers, level.tolist(), model, strict=True)
    ]


MODEL_TEXTS = [*(LEVEL_MODELS[k] for k in range(len(LEVEL_MODELS))), FACTOR_MODEL]
"""What `model_codes` stand for: a level's words (by level), then a factor's."""


def model_codes(a: Attribution, answer: PortfolioAnswer) -> tuple[np.ndarray, np.ndarray]:
    """Each position's `model_level` and the index of its `model` in `MODEL_TEXTS`."""
    level = answer.model_levels(a)
    return level, np.where(answer.is_factor(a), len(LEVEL_MODELS), level)


def attribution_dict(
    a: Attribution, answer: PortfolioAnswer | None = None, *, positions: Any = None
) -> dict[str, Any]:
    """An attribution as plain JSON-ready numbers (with `answer`, each position's
    `model_level` and `model`); `positions`: what stands for the list of positions (the API
    writes it from the arrays in one go), else `position_rows`."""
    f = a.factors
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
        "positions": position_rows(a, answer) if positions is None else positions,
    }


ANNUAL = float(ANNUALIZATION)
