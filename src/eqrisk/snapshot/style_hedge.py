"""The optional style-neutral hedge of `POST /api/portfolio/risk` (`style_neutral: true`): legs in
the factor ETFs of the data set (`model.style_hedge.STYLE_ETFS`) that take the book's style
exposure down, then the ETF hedge of the book with those legs, and what is left.

The ETFs' style loadings of session t come from the version's stored series before t (each
ETF's `l3_rr`, its specific return after its market hedge, and the style factors' returns
`sret`): read once per (version, session) and kept in a small LRU beside the day's model
(`risk_days`), so a second request of that session does arithmetic only."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cachetools import LRUCache

from eqrisk.model.portfolio_risk import portfolio_risk
from eqrisk.model.risk_model import RiskModelDay
from eqrisk.model.style_hedge import (
    LOADING_WINDOW,
    STYLE_ETFS,
    EtfLoadings,
    neutral_legs,
    style_loadings,
    tradable_etfs,
    with_loadings,
)
from eqrisk.snapshot.portfolio import ANNUAL, HedgeLegs, _hedge
from eqrisk.snapshot.risk_days import day_level, risk_day
from eqrisk.snapshot.style_series import style_returns
from eqrisk.snapshot.version import Snapshot

MAX_DAYS = 16
_lock = threading.Lock()
_loadings: LRUCache[tuple[str, int, tuple[str, ...]], EtfLoadings] = LRUCache(maxsize=MAX_DAYS)


@dataclass(frozen=True)
class StyleNeutral:
    """The style legs, the ETF hedge of the book with them, and the style exposure before and
    after (per style factor with a covariance that session)."""

    keys: list[str]  # the factor ETFs bought (negative: sold)
    notional: list[float]
    loadings: list[dict[str, float]]  # each leg's style loadings
    hedge: HedgeLegs  # the ETF hedge of positions + style legs, and vol_after with both
    factors: list[str]
    exposure_before: list[float]
    exposure_after: list[float]


def etf_loadings(snap: Snapshot, t: int, candidates: Sequence[str] = STYLE_ETFS) -> EtfLoadings:
    """The candidates' style loadings on session t, from the `LOADING_WINDOW` sessions before
    it (cached per version, session and candidates)."""
    key = (str(snap.path), int(t), tuple(candidates))
    with _lock:
        found = _loadings.get(key)
    if found is not None:
        return found
    day = risk_day(snap, t)
    known = [c for c in candidates if c in snap.row_of and c in day.row_of]
    lo = max(t - LOADING_WINDOW, 0)
    hi = min(t, len(snap.sessions))
    rows = np.array([snap.row_of[c] for c in known], dtype=np.int64)
    resid = np.asarray(snap.array("l3_rr")[rows, lo:hi]).reshape(len(known), hi - lo)
    loadings, r2 = style_loadings(resid, style_returns(snap, lo, hi).T)
    found = tradable_etfs(day, known, loadings, r2)
    with _lock:
        _loadings[key] = found
    return found


def style_neutral(
    snap: Snapshot,
    t: int,
    positions: Mapping[str, float],
    *,
    hedge_level: int = 3,
    candidates: Sequence[str] = STYLE_ETFS,
) -> StyleNeutral:
    """The style-neutral hedge of `positions` on session t (see the module docstring)."""
    etfs = etf_loadings(snap, t, candidates)
    day = with_loadings(risk_day(snap, t), etfs)
    k0 = day.n_etf
    names = day.factor_keys[k0:]
    before = _style_exposure(day, positions)
    legs = neutral_legs(day, before, etfs)
    book = dict(positions)
    for key, n in zip(etfs.keys, legs.tolist(), strict=True):
        book[key] = book.get(key, 0.0) + n
    at = (
        day
        if hedge_level == day_level(snap)
        else with_loadings(risk_day(snap, t, hedge_level), etfs)
    )
    hedge = _hedge(day, at, portfolio_risk(day, book), book, hedge_level)
    hedged = dict(book)
    for key, n, ok in zip(hedge.keys, hedge.notional, hedge.tradable, strict=True):
        if ok:
            hedged[key] = hedged.get(key, 0.0) + n
    after = _style_exposure(day, hedged)
    ready = np.isfinite(np.diag(day.cov)[k0:])
    return StyleNeutral(
        keys=etfs.keys,
        notional=legs.tolist(),
        loadings=[
            {n: float(v) for n, v, ok in zip(names, row, ready, strict=True) if ok}
            for row in etfs.loadings.tolist()
        ],
        hedge=hedge,
        factors=[n for n, ok in zip(names, ready, strict=True) if ok],
        exposure_before=before[ready].tolist(),
        exposure_after=after[ready].tolist(),
    )


def _style_exposure(day: RiskModelDay, positions: Mapping[str, float]) -> np.ndarray:
    """(S,) the usable positions' exposure to the day's style factors (0 without a covariance)."""
    x = np.zeros(len(day.factor_keys) - day.n_etf)
    f = portfolio_risk(day, positions).portfolio.factors
    where = {k: i for i, k in enumerate(day.factor_keys[day.n_etf :])}
    for key, level, value in zip(f.keys, f.levels, f.exposure.tolist(), strict=True):
        if level == "style":
            x[where[key]] = value
    return x


def style_dict(s: StyleNeutral) -> dict[str, Any]:
    """The style-neutral hedge as plain JSON-ready numbers (`hedge.style_neutral`)."""
    h = s.hedge
    return {
        "legs": [
            {"etf": k, "notional": n, "loadings": b}
            for k, n, b in zip(s.keys, s.notional, s.loadings, strict=True)
        ],
        "etf_legs": [
            {"etf": k, "notional": n, "tradable": ok, "exposure_after": x}
            for k, n, ok, x in zip(h.keys, h.notional, h.tradable, h.exposure_after, strict=True)
        ],
        "style_exposure_before": dict(zip(s.factors, s.exposure_before, strict=True)),
        "style_exposure_after": dict(zip(s.factors, s.exposure_after, strict=True)),
        "vol_after_daily": h.vol_after,
        "vol_after_annual": h.vol_after * ANNUAL,
        "after": h.after,
    }


def clear() -> None:
    """Forget the cached loadings (tests)."""
    with _lock:
        _loadings.clear()
