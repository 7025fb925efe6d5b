"""A portfolio's risk on a session of a snapshot: the stored risk model of that session
(`risk_store.model_day`) and `model.portfolio_risk` on it, with the ETF hedge at a chosen level.

The HTTP layer never imports the model: the route calls `portfolio_answer` here and receives
plain numbers. The hedge at level L sells, per ETF of that level, the portfolio's exposure
through the L hedge ratios published on the previous session (what the portfolio page shows);
its volatility after is the risk model's volatility of the positions plus those ETF legs, so at
the model's level (L3) the hedged portfolio has no factor exposure and what is left is its
specific risk (where every factor is an ETF; a group portfolio cannot be traded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqrisk.model.portfolio_risk import Attribution, PortfolioRisk, Unusable, portfolio_risk
from eqrisk.model.risk_model import ANNUALIZATION, RiskModelDay
from eqrisk.snapshot.risk_store import model_day
from eqrisk.snapshot.versions import Snapshot

__all__ = ["HedgeLegs", "PortfolioAnswer", "portfolio_answer", "risk_day"]


def risk_day(snap: Snapshot, t: int, level: int | None = None) -> RiskModelDay:
    """The risk model of session t (exposures of `level`, default the model's)."""
    arrays = {name: snap.array(name) for name in _needed(snap)}
    return model_day(snap.path, snap.manifest, arrays, t, level=level)


def _needed(snap: Snapshot) -> list[str]:
    from eqrisk.snapshot.risk_store import HEDGE_FIELDS

    return [*HEDGE_FIELDS, "risk_specific_var"]


@dataclass(frozen=True)
class HedgeLegs:
    level: int
    keys: list[str]
    notional: list[float]  # to buy (negative: sell) of each factor
    tradable: list[bool]
    vol_after: float
    exposure_after: list[float]  # each leg's factor exposure of positions + tradable legs


@dataclass(frozen=True)
class PortfolioAnswer:
    session: int
    risk: PortfolioRisk
    hedge: HedgeLegs


def _exposure(day: RiskModelDay, positions: Mapping[str, float], keys: list[str]) -> list[float]:
    """The factor exposure x = H'w of usable positions, per factor key."""
    rows = [day.row_of.get(t, -1) for t in positions]
    x = np.zeros(len(day.factor_keys))
    for r, w in zip(rows, positions.values(), strict=True):
        if r < 0 or not day.usable[r] or not np.isfinite(w):
            continue
        for j in range(3):
            k = int(day.index[r, j])
            if k >= 0:
                x[k] += day.values[r, j] * w
    where = {k: i for i, k in enumerate(day.factor_keys)}
    return [float(x[where[k]]) for k in keys]


def portfolio_answer(
    snap: Snapshot,
    t: int,
    positions: Mapping[str, float],
    *,
    benchmark: Mapping[str, float] | None = None,
    hedge_level: int = 3,
) -> PortfolioAnswer:
    """The risk of `positions` on session t, its tracking error against `benchmark`, and the
    ETF hedge at `hedge_level` with the volatility left after it."""
    day = risk_day(snap, t)
    risk = portfolio_risk(day, positions, benchmark=benchmark)
    at = day if hedge_level == day_level(snap) else risk_day(snap, t, level=hedge_level)
    legs = portfolio_risk(at, positions).hedge
    hedged = dict(positions)
    universe = day.row_of
    for key, notional, ok in zip(legs.keys, legs.notional.tolist(), legs.tradable, strict=True):
        if ok and key in universe:
            hedged[key] = hedged.get(key, 0.0) + notional
    used = {k: v for k, v in hedged.items() if k not in {u.ticker for u in risk.unusable}}
    after = portfolio_risk(day, used).portfolio.vol if used else 0.0
    tradable = [ok and key in universe for key, ok in zip(legs.keys, legs.tradable, strict=True)]
    exposure_after = _exposure(at, used, legs.keys)
    return PortfolioAnswer(
        session=t,
        risk=risk,
        hedge=HedgeLegs(
            level=hedge_level,
            keys=legs.keys,
            notional=legs.notional.tolist(),
            tradable=tradable,
            vol_after=after,
            exposure_after=exposure_after,
        ),
    )


def day_level(snap: Snapshot) -> int:
    return int(snap.manifest["risk"]["params"]["level"])


def attribution_dict(a: Attribution) -> dict[str, Any]:
    """An attribution as plain JSON-ready numbers."""
    f, p = a.factors, a.positions
    return {
        "vol_daily": a.vol,
        "vol_annual": a.vol_annual,
        "factor_vol_daily": a.factor_vol,
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
            }
            for i in range(len(p.tickers))
        ],
    }


def unusable_list(items: list[Unusable]) -> list[dict[str, str]]:
    return [{"ticker": u.ticker, "reason": u.reason} for u in items]


ANNUAL = float(ANNUALIZATION)
