"""Cross-sectional rankings of the real Service B's vocabulary (metric x cohort x window), from
the snapshot's arrays (docs/decisions/drop-in-routes.md, "Rankings").

A ranking is of the stocks priced on the ranked session. Every metric ranks its largest value
first: `rank_ordinal` = 1 + the number of the cohort's members with a strictly larger value,
`rank_percentile` = (1 - (rank_ordinal - 1) / cohort_size) x 100, which is pandas'
`rank(method="max", pct=True) x 100` of the cohort (100 = the largest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from eqrisk.snapshot.versions import Snapshot

Metric = Literal[
    "mkt_cap", "gross_return", "sector_residual", "subsector_residual", "er_l1", "er_l2", "er_l3"
]
Cohort = Literal["universe", "sector", "subsector"]
Window = Literal["1d", "21d", "63d", "252d"]
METRICS: tuple[Metric, ...] = (
    "mkt_cap",
    "gross_return",
    "sector_residual",
    "subsector_residual",
    "er_l1",
    "er_l2",
    "er_l3",
)
COHORTS: tuple[Cohort, ...] = ("universe", "sector", "subsector")
WINDOWS: tuple[Window, ...] = ("1d", "21d", "63d", "252d")
SESSIONS: dict[str, int] = {"1d": 1, "21d": 21, "63d": 63, "252d": 252}
POINT_IN_TIME = ("mkt_cap", "er_l1", "er_l2", "er_l3")  # served under window 1d only
_RESIDUAL = {"sector_residual": "l2_rr", "subsector_residual": "l3_rr"}
_UNEXPLAINED = {"er_l1": "l1_res_er", "er_l2": "l2_res_er", "er_l3": "l3_res_er"}


@dataclass(frozen=True)
class Universe:
    """The stocks priced on session `t`: their tickers, rows and cohort keys (sector ETF,
    subsector ETF; None where the stock has none)."""

    t: int
    tickers: np.ndarray  # (n,) str, sorted
    rows: np.ndarray  # (n,) int
    sector: np.ndarray  # (n,) object
    subsector: np.ndarray  # (n,) object


def universe(snap: Snapshot, t: int) -> Universe:
    idx = snap.index
    price = snap.array("price_close")
    syms = [
        s
        for s in (idx.symbols[k] for k in idx.tickers)
        if s.asset_type == "stock" and s.first <= t <= s.last and np.isfinite(price[s.row, t])
    ]
    return Universe(
        t,
        np.array([s.ticker for s in syms], dtype=str),
        np.array([s.row for s in syms], dtype=np.int64),
        np.array([s.sector_etf for s in syms], dtype=object),
        np.array([s.subsector_etf for s in syms], dtype=object),
    )


def values(snap: Snapshot, u: Universe, metric: str, window: str) -> np.ndarray:
    """The metric of each stock of `u` over the window ending at `u.t` (NaN: not available,
    a point-in-time metric outside 1d, or a window with a missing return)."""
    n = len(u.rows)
    if metric in POINT_IN_TIME:
        if window != "1d":
            return np.full(n, np.nan)
        if metric == "mkt_cap":
            return np.asarray(snap.array("market_cap")[u.rows, u.t], dtype=np.float64)
        return 1.0 - np.asarray(snap.array(_UNEXPLAINED[metric])[u.rows, u.t], dtype=np.float64)
    w = SESSIONS[window]
    lo = u.t + 1 - w
    if lo < 0:
        return np.full(n, np.nan)
    field = "return" if metric == "gross_return" else _RESIDUAL[metric]
    block = np.asarray(snap.array(field)[u.rows, lo : u.t + 1], dtype=np.float64)
    if metric == "gross_return":
        out: np.ndarray = np.prod(1.0 + block, axis=1) - 1.0  # NaN where a return is missing
        return out
    summed: np.ndarray = block.sum(axis=1)
    return summed


@dataclass(frozen=True)
class Ranks:
    """Per stock of a universe: its rank in its cohort (0 = unranked), the cohort's size
    (0 = no cohort / no value) and its percentile (NaN = unranked)."""

    ordinal: np.ndarray
    size: np.ndarray
    percentile: np.ndarray
    value: np.ndarray


def cohort_keys(u: Universe, cohort: str) -> np.ndarray:
    if cohort == "universe":
        return np.full(len(u.rows), "all", dtype=object)
    return u.sector if cohort == "sector" else u.subsector


def rank(v: np.ndarray, keys: np.ndarray) -> Ranks:
    """Rank `v` (largest first) within each cohort key (None: no cohort); NaN is unranked."""
    n = len(v)
    ordinal = np.zeros(n, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    ok = np.isfinite(v) & np.array([k is not None for k in keys], dtype=bool)
    for key in {k for k in keys[ok]}:
        members = np.flatnonzero(ok & (keys == key))
        neg = np.sort(-v[members])
        ordinal[members] = np.searchsorted(neg, -v[members], side="left") + 1
        size[members] = len(members)
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(size > 0, (1.0 - (ordinal - 1) / np.maximum(size, 1)) * 100.0, np.nan)
    return Ranks(ordinal, size, pct, v)


def ranks(snap: Snapshot, u: Universe, metric: str, cohort: str, window: str) -> Ranks:
    return rank(values(snap, u, metric, window), cohort_keys(u, cohort))


def display_label(metric: str, cohort: str, window: str) -> str:
    return f"{window} · {cohort} · {metric}"
