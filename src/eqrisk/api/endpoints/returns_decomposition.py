"""`GET /api/returns-decomposition`: a stock's daily return split, per level, into its combined
factor return and its residual, column-wise in the real Service B's shape; optionally the L*
level of each session (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Any

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api import lstar
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.endpoints.l3_decomposition import check_market_etf
from eqrisk.api.models import JSON_RESPONSES
from eqrisk.api.params import Ticker, VersionedParams
from eqrisk.api.plans import SeriesPlan, lookup, require_rows, series_plan, series_ticker, window
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.versions import Snapshot

MAX_DECOMPOSITION_YEARS = 10
LEVEL_ETFS = ("market_etf", "sector_etf", "subsector_etf")


class ReturnsDecompositionParams(VersionedParams):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])
    years: int = Field(
        1,
        ge=1,
        le=MAX_DECOMPOSITION_YEARS,
        description=f"Years of history up to data_as_of (1 to {MAX_DECOMPOSITION_YEARS}).",
    )
    market_factor_etf: Ticker | None = Field(
        None, description="Only the snapshot's market ETF (SPY) is served; any other is a 400."
    )
    include_lstar: bool = Field(
        False,
        description=(
            "true: add `lstar` (the L* level of each session: L1, L2 or L3) and "
            "`lstar_residual_return` (that level's residual return)."
        ),
    )
    threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        description=(
            "With include_lstar: go one level deeper only where it lowers the out-of-sample "
            "residual share by at least this much (e.g. 0.01); default: the level with the "
            "least residual share."
        ),
    )


def plan_decomposition(snap: Snapshot, p: ReturnsDecompositionParams) -> SeriesPlan:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    check_market_etf(idx, p.market_factor_etf)
    lo, hi, start, end = window(idx, p.years)
    return require_rows(snap, series_plan(snap, sym, lo, hi, start, end))


def size(plan: SeriesPlan, p: ReturnsDecompositionParams) -> Size:
    ncols = 10 + (2 if p.include_lstar else 0)
    return Size(1, plan.rows, approx_bytes(plan.rows, ncols, "json"))


def _listed(values: np.ndarray) -> list[float | None]:
    return [None if v != v else v for v in values.tolist()]


def etf_returns(snap: Snapshot, plan: SeriesPlan, etf: str | None) -> np.ndarray:
    """The daily return of `etf` on the plan's dates (NaN throughout when there is none)."""
    sym = snap.index.symbols.get(etf) if etf else None
    if sym is None:
        return np.full(plan.rows, np.nan)
    row: np.ndarray = np.asarray(snap.array("return")[sym.row, plan.lo : plan.hi])
    out: np.ndarray = row[plan.mask]
    return out


def decomposition_columns(
    snap: Snapshot, plan: SeriesPlan, include_lstar: bool, threshold: float | None
) -> dict[str, Any]:
    """`{dates, gross_return, l{k}_factor_return, l{k}_combined_factor_return,
    l{k}_residual_return}` (+ `lstar`, `lstar_residual_return`, `threshold_used`)."""
    sym = plan.symbol
    out: dict[str, Any] = {
        "dates": [str(d) for d in plan.dates(snap).astype("datetime64[D]")],
        "gross_return": _listed(plan.column(snap, "return")),
    }
    for k, attr in enumerate(LEVEL_ETFS, start=1):
        out[f"l{k}_factor_return"] = _listed(etf_returns(snap, plan, getattr(sym, attr)))
    for k in (1, 2, 3):
        out[f"l{k}_combined_factor_return"] = _listed(plan.column(snap, f"l{k}_cfr"))
    for k in (1, 2, 3):
        out[f"l{k}_residual_return"] = _listed(plan.column(snap, f"l{k}_rr"))
    if include_lstar:
        hq = np.vstack([plan.column(snap, f) for f in lstar.HQ_FIELDS])
        rr = np.vstack([plan.column(snap, f) for f in lstar.RR_FIELDS])
        levels = lstar.lstar_levels(hq, threshold)
        out["lstar"] = lstar.level_names(levels)
        out["lstar_residual_return"] = _listed(lstar.pick(rr, levels))
        out["threshold_used"] = threshold
    return out


def render(call: Call[ReturnsDecompositionParams, SeriesPlan]) -> Response:
    p, plan = call.params, call.plan
    doc = decomposition_columns(call.snap, plan, p.include_lstar, p.threshold)
    sym = plan.symbol
    doc["ticker"] = sym.ticker
    doc["meta"] = {
        **sym.meta(),
        "years": p.years,
        "from": plan.start,
        "to": plan.end,
        "rows": plan.rows,
        "factor_return": "the level's own ETF return: l1 market, l2 sector, l3 subsector ETF",
    }
    return document(call.snap, doc)


ENDPOINT = Endpoint(
    path="/api/returns-decomposition",
    service="risk",
    price_key="returns-decomposition",
    params=ReturnsDecompositionParams,
    plan=plan_decomposition,
    size=size,
    tickers=series_ticker,
    render=render,
    threaded=True,
    doc=Doc(
        name="returns_decomposition",
        summary="Daily return split into factor and residual per level (Service B's shape)",
        description=(
            "Column-wise over the last `years` years: `dates`, `gross_return`, per level k = "
            "1, 2, 3 `lk_factor_return` (the return of that level's own ETF: market, sector, "
            "subsector), `lk_combined_factor_return` (the previous session's hedge applied to "
            "this session's ETF returns) and `lk_residual_return`; gross = combined + residual "
            "on every session. `include_lstar=true` adds `lstar` and `lstar_residual_return` "
            "(the L* rule of docs/decisions/drop-in-routes.md)."
        ),
        responses=JSON_RESPONSES,
    ),
)
