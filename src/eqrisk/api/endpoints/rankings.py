"""`GET /api/rankings/{ticker}`, `GET /api/rankings/top`, `POST /api/rankings/screen`: the real
Service B's cross-sectional rankings (metric x cohort x window), computed by
`api/ranking_table.py` (docs/decisions/drop-in-routes.md, "Rankings")."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field
from starlette.responses import Response

from eqrisk.api import ranking_table as rt
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint, no_tickers
from eqrisk.api.errors import ApiError
from eqrisk.api.models import BODY_ERRORS, ERRORS_NO_TICKER, JSON_RESPONSES
from eqrisk.api.params import (
    BodyParams,
    IsoDate,
    Ticker,
    VersionedParams,
    path_and_query,
)
from eqrisk.api.plans import lookup
from eqrisk.api.sizes import Size
from eqrisk.data.master import MAG7
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot

MAX_TOP, MAX_SCREEN = 100, 500


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


MetricParam = Annotated[rt.Metric, BeforeValidator(_lower)]
CohortParam = Annotated[rt.Cohort, BeforeValidator(_lower)]
WindowParam = Annotated[rt.Window, BeforeValidator(_lower)]
METRIC_DOC = f"One of {', '.join(rt.METRICS)} (largest value ranks first)."
COHORT_DOC = "universe (all stocks), sector (same sector ETF) or subsector (same subsector ETF)."
WINDOW_DOC = "1d, 21d, 63d or 252d (mkt_cap and er_l* exist under 1d only)."


def latest_session(snap: Snapshot, as_of: date | None = None) -> int:
    """The ranked session: data_as_of, or the last session on or before `as_of`."""
    idx = snap.index
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    if as_of is None:
        return idx.n_sessions - 1
    t = int(np.searchsorted(idx.sessions, np.datetime64(as_of, "D"), side="right")) - 1
    if t < 0:
        raise ApiError(
            "INVALID_PARAMETER",
            f"as_of={as_of} is before the first session ({idx.first_session}); give a date "
            f"from {idx.first_session} to {idx.data_as_of}",
            parameter="as_of",
        )
    return t


def _day(snap: Snapshot, t: int) -> date:
    out: date = snap.sessions[t].astype(object)
    return out


# ------------------------------------------------------------------------------ one ticker


class TickerRankingsQuery(VersionedParams):
    metric: MetricParam | None = Field(None, description=f"Filter: {METRIC_DOC}")
    cohort: CohortParam | None = Field(None, description=f"Filter: {COHORT_DOC}")
    window: WindowParam | None = Field(None, description=f"Filter: {WINDOW_DOC}")


class TickerRankingsParams(TickerRankingsQuery):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


def _cells(p: TickerRankingsQuery) -> list[tuple[str, str, str]]:
    """(window, cohort, metric) asked: windows outermost, then cohorts, then metrics."""
    return [
        (w, c, m)
        for w in ([p.window] if p.window else rt.WINDOWS)
        for c in ([p.cohort] if p.cohort else rt.COHORTS)
        for m in ([p.metric] if p.metric else rt.METRICS)
    ]


def plan_ticker(snap: Snapshot, p: TickerRankingsParams) -> Symbol:
    latest_session(snap)
    return lookup(snap.index, p.ticker)


def size_ticker(sym: Symbol, p: TickerRankingsParams) -> Size:
    rows = len(_cells(p))
    return Size(1, rows, 600 + 180 * rows)


def render_ticker(call: Call[TickerRankingsParams, Symbol]) -> Response:
    snap, p, sym = call.snap, call.params, call.plan
    t = latest_session(snap)
    u = rt.universe(snap, t)
    where = np.flatnonzero(u.tickers == sym.ticker)
    teo = _day(snap, t) if len(where) else None
    rows: list[dict[str, Any]] = []
    if len(where):
        i = int(where[0])
        for w, c, m in _cells(p):
            r = rt.ranks(snap, u, m, c, w)
            ranked = r.size[i] > 0
            rows.append(
                {
                    "metric": m,
                    "cohort": c,
                    "window": w,
                    "rank_ordinal": int(r.ordinal[i]) if ranked else None,
                    "cohort_size": int(r.size[i]) if ranked else None,
                    "rank_percentile": float(r.percentile[i]) if ranked else None,
                    "value": float(r.value[i]) if ranked else None,
                    "display_label": rt.display_label(m, c, w),
                }
            )
    doc = {
        "ticker": sym.ticker,
        "symbol": sym.ticker,
        "teo": teo,
        "date": teo,
        "rankings": rows,
        "filters": {"metric": p.metric, "cohort": p.cohort, "window": p.window},
    }
    return document(snap, doc)


# ------------------------------------------------------------------------------ top and screen


@dataclass(frozen=True)
class Cell:
    """What a top or screen request asks for, decided on the loop: the cell, the ranked
    session and the limit; the renderer ranks (it reads every stock's row)."""

    metric: str
    cohort: str
    window: str
    t: int
    limit: int


@dataclass(frozen=True)
class Ranked:
    """The ranked rows of one cell, best first, before the limit."""

    tickers: np.ndarray
    ranks: rt.Ranks
    order: np.ndarray  # positions into tickers, best first, ranked stocks only


def ranked_cell(snap: Snapshot, cell: Cell) -> Ranked:
    u = rt.universe(snap, cell.t)
    r = rt.ranks(snap, u, cell.metric, cell.cohort, cell.window)
    ok = np.flatnonzero(r.size > 0)
    order = ok[np.lexsort((u.tickers[ok], -r.percentile[ok]))]
    return Ranked(u.tickers, r, order)


def _rows(ranked: Ranked, limit: int, demo: bool) -> list[dict[str, Any]]:
    order = ranked.order
    if demo:  # the demo key sees its seven tickers (gate.demo_rules), not the market
        order = order[np.isin(ranked.tickers[order], MAG7)]
    r = ranked.ranks
    return [
        {
            "symbol": str(ranked.tickers[i]),
            "ticker": str(ranked.tickers[i]),
            "rank_ordinal": int(r.ordinal[i]),
            "cohort_size": int(r.size[i]),
            "rank_percentile": float(r.percentile[i]),
            "value": float(r.value[i]),
        }
        for i in order[:limit].tolist()
    ]


class TopParams(VersionedParams):
    metric: MetricParam = Field(description=METRIC_DOC)
    cohort: CohortParam = Field(description=COHORT_DOC)
    window: WindowParam = Field(description=WINDOW_DOC)
    limit: int = Field(10, ge=1, le=MAX_TOP, description=f"Rows, 1 to {MAX_TOP}.")


def plan_top(snap: Snapshot, p: TopParams) -> Cell:
    return Cell(p.metric, p.cohort, p.window, latest_session(snap), p.limit)


def size_cell(cell: Cell, p: Any) -> Size:
    """At most `limit` rows (the estimate cannot know how many stocks rank before ranking)."""
    return Size(1, cell.limit, 500 + 160 * cell.limit)


def render_top(call: Call[TopParams, Cell]) -> Response:
    p, cell = call.params, call.plan
    ranked = ranked_cell(call.snap, cell)
    doc = {
        "teo": _day(call.snap, cell.t),
        "metric": p.metric,
        "cohort": p.cohort,
        "window": p.window,
        "limit": p.limit,
        "rankings": _rows(ranked, cell.limit, call.caller.is_demo),
    }
    return document(call.snap, doc)


class ScreenParams(BodyParams, VersionedParams):
    metric: MetricParam = Field(description=METRIC_DOC)
    cohort: CohortParam = Field(description=COHORT_DOC)
    window: WindowParam = Field(description=WINDOW_DOC)
    limit: int = Field(100, ge=1, le=MAX_SCREEN, description=f"Rows, 1 to {MAX_SCREEN}.")
    min_percentile: float | None = Field(
        None, ge=0, le=100, description="Keep rank_percentile >= this."
    )
    decile: int | None = Field(
        None,
        ge=1,
        le=10,
        description="Keep one decile: 1 = percentile above 90 (the best), 10 = 10 and below.",
    )
    sector_filter: str | None = Field(
        None,
        max_length=64,
        description="Keep one sector: its sector ETF (XLK) or GICS sector name, any case.",
    )
    as_of: IsoDate | None = Field(
        None, description="Rank on the last session on or before this date (default: latest)."
    )


def plan_screen(snap: Snapshot, p: ScreenParams) -> Cell:
    return Cell(p.metric, p.cohort, p.window, latest_session(snap, p.as_of), p.limit)


def screened(snap: Snapshot, cell: Cell, p: ScreenParams) -> Ranked:
    """The ranked cell filtered by min_percentile, decile and sector_filter."""
    ranked = ranked_cell(snap, cell)
    keep = np.ones(len(ranked.order), dtype=bool)
    pct = ranked.ranks.percentile[ranked.order]
    if p.min_percentile is not None:
        keep &= pct >= p.min_percentile
    if p.decile is not None:
        keep &= (pct > (10 - p.decile) * 10) & (pct <= (11 - p.decile) * 10)
    if p.sector_filter is not None:
        wanted = p.sector_filter.strip().upper()
        idx = snap.index
        syms = [idx.symbols[str(t)] for t in ranked.tickers[ranked.order]]
        keep &= np.array(
            [wanted in ((s.sector_etf or "").upper(), (s.sector or "").upper()) for s in syms],
            dtype=bool,
        )
    return Ranked(ranked.tickers, ranked.ranks, ranked.order[keep])


def render_screen(call: Call[ScreenParams, Cell]) -> Response:
    p, cell = call.params, call.plan
    ranked = screened(call.snap, cell, p)
    doc = {
        "teo": _day(call.snap, cell.t),
        "metric": p.metric,
        "cohort": p.cohort,
        "window": p.window,
        "limit": p.limit,
        "matched_count": len(ranked.order),
        "rankings": _rows(ranked, cell.limit, call.caller.is_demo),
    }
    return document(call.snap, doc)


RANKINGS_NOTE = (
    " Every metric ranks its largest value first; rank_percentile = (1 - (rank_ordinal - 1) / "
    "cohort_size) x 100 (pandas rank(method='max', pct=True) x 100). Stocks priced on the "
    "ranked session only."
)

TOP = Endpoint(
    path="/api/rankings/top",
    service="risk",
    price_key="rankings/top",
    params=TopParams,
    plan=plan_top,
    size=size_cell,
    tickers=no_tickers,
    render=render_top,
    threaded=True,
    doc=Doc(
        name="rankings_top",
        summary="The best-ranked stocks of one metric, cohort and window",
        description="`limit` rows, best first, on data_as_of." + RANKINGS_NOTE,
        responses=ERRORS_NO_TICKER,
    ),
)
SCREEN = TOP.variant(
    path="/api/rankings/screen",
    method="POST",
    price_key="rankings/screen",
    params=ScreenParams,
    plan=plan_screen,
    render=render_screen,
    doc=Doc(
        name="rankings_screen",
        summary="Stocks whose ranking passes a screen",
        description=(
            "The ranked stocks of one cell filtered by `min_percentile`, `decile` and "
            "`sector_filter`, best first, `matched_count` before the `limit`." + RANKINGS_NOTE
        ),
        responses={**ERRORS_NO_TICKER, **BODY_ERRORS},
    ),
)
TICKER = TOP.variant(
    path="/api/rankings/{ticker}",
    price_key="rankings",
    params=TickerRankingsParams,
    reader=path_and_query(TickerRankingsQuery, TickerRankingsParams),
    plan=plan_ticker,
    size=size_ticker,
    tickers=lambda sym: (sym.ticker,),
    render=render_ticker,
    doc=Doc(
        name="rankings",
        summary="One stock's rankings (the real Service B's shape)",
        description=(
            "Rows `{metric, cohort, window, rank_ordinal, cohort_size, rank_percentile, value, "
            "display_label}`: the full 4 x 3 x 7 grid (windows, then cohorts, then metrics) or "
            "the cells the filters keep; a cell without a value is a row of nulls; a symbol not "
            "priced on data_as_of (an ETF, a delisted stock) gets `rankings: []`." + RANKINGS_NOTE
        ),
        responses=JSON_RESPONSES,
    ),
)
