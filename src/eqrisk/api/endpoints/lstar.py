"""`GET /api/lstar` and `POST /api/batch/lstar`: the L* hedge level of each session and what it
hedges, in the real Service B's column layout (the rule: `api/lstar.py`; docs/decisions/
drop-in-routes.md, "L*")."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from functools import partial
from typing import Any

import numpy as np
from pydantic import Field, field_validator
from starlette.responses import Response

from eqrisk.api import lstar
from eqrisk.api.answers import document, snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.endpoints.batch_analyze import served_tickers
from eqrisk.api.endpoints.l3_decomposition import check_market_etf
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import JSON, render
from eqrisk.api.models import BODY_ERRORS, ERRORS_NO_TICKER, JSON_RESPONSES
from eqrisk.api.params import BodyParams, Format, Ticker, VersionedParams
from eqrisk.api.plans import (
    BatchPlan,
    SeriesPlan,
    lookup,
    no_prices,
    require_rows,
    resolve,
    series_plan,
    series_ticker,
    ticker_not_found,
    window,
)
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.versions import Snapshot

MAX_LSTAR_YEARS, MAX_LSTAR_TICKERS = 10, 100
THRESHOLD_DOC = (
    "Go one level deeper only where it lowers the out-of-sample residual share by at least this "
    "much (e.g. 0.01); default: the level with the least residual share."
)


def _listed(values: np.ndarray) -> list[Any]:
    if values.dtype == object:
        return list(values)
    return [None if v != v else v for v in values.tolist()]


def columns_of(snap: Snapshot, plan: SeriesPlan, threshold: float | None) -> dict[str, Any]:
    cols = lstar.lstar_columns(lambda f: plan.column(snap, f), threshold)
    return {
        "dates": [str(d) for d in plan.dates(snap).astype("datetime64[D]")],
        **{k: _listed(v) for k, v in cols.items()},
        "threshold_used": threshold,
    }


class LstarParams(VersionedParams):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])
    years: int = Field(1, ge=1, le=MAX_LSTAR_YEARS, description="Years up to data_as_of.")
    market_factor_etf: Ticker | None = Field(
        None, description="Only the snapshot's market ETF (SPY) is served; any other is a 400."
    )
    threshold: float | None = Field(None, ge=0, le=1, description=THRESHOLD_DOC)


def plan_lstar(snap: Snapshot, p: LstarParams) -> SeriesPlan:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    check_market_etf(idx, p.market_factor_etf)
    lo, hi, start, end = window(idx, p.years)
    return require_rows(snap, series_plan(snap, sym, lo, hi, start, end))


def size_lstar(plan: SeriesPlan, p: LstarParams) -> Size:
    return Size(1, plan.rows, approx_bytes(plan.rows, 8, "json", 2))


def render_lstar(call: Call[LstarParams, SeriesPlan]) -> Response:
    doc = columns_of(call.snap, call.plan, call.params.threshold)
    doc["ticker"] = call.plan.symbol.ticker
    return document(call.snap, doc)


class BatchLstarParams(BodyParams, VersionedParams):
    tickers: list[Ticker] = Field(
        min_length=1,
        max_length=MAX_LSTAR_TICKERS,
        description=f"1 to {MAX_LSTAR_TICKERS} tickers; an unknown one fails alone, free.",
    )
    years: int = Field(1, ge=1, le=MAX_LSTAR_YEARS, description="Years up to data_as_of.")
    format: Format = Field(
        "json",
        description=(
            "json: `{results: {T: {status, <the /api/lstar arrays>}}}`; csv or parquet: one "
            "long table (ticker, date, lstar, residual_return, market_hr, sector_hr, "
            "subsector_hr, total_er)."
        ),
    )
    market_factor_etf: Ticker | None = Field(None, description="As /api/lstar.")
    threshold: float | None = Field(None, ge=0, le=1, description=THRESHOLD_DOC)

    @field_validator("tickers")
    @classmethod
    def _dedupe(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))


def plan_batch(snap: Snapshot, p: BatchLstarParams) -> BatchPlan:
    idx = snap.index
    check_market_etf(idx, p.market_factor_etf)
    lo, hi, start, end = window(idx, p.years)
    items: dict[str, SeriesPlan | ApiError] = {}
    for ticker in p.tickers:
        sym = resolve(idx, ticker)
        if sym is None:
            items[ticker] = ticker_not_found(idx, [ticker])
            continue
        plan = series_plan(snap, sym, lo, hi, start, end)
        items[ticker] = plan if plan.rows else no_prices(idx, sym, start, end)
    return BatchPlan(items, ("lstar",), p.years, p.format)


def size_batch(plan: BatchPlan, p: BatchLstarParams) -> Size:
    rows = sum(i.rows for i in plan.items.values() if isinstance(i, SeriesPlan))
    ok = plan.succeeded
    note = f"charged per succeeded ticker: {ok} of {len(plan.items)} requested tickers exist"
    return Size(ok, rows, approx_bytes(rows, 7, plan.format, 2), note)


LONG = ("lstar", "residual_return", "market_hr", "sector_hr", "subsector_hr", "total_er")


def render_batch(call: Call[BatchLstarParams, BatchPlan]) -> Response:
    snap, plan, threshold = call.snap, call.plan, call.params.threshold
    if plan.format != JSON:
        parts: list[dict[str, np.ndarray]] = []
        for ticker, item in plan.items.items():
            if isinstance(item, ApiError):
                continue
            cols = lstar.lstar_columns(partial(item.column, snap), threshold)
            n = item.rows
            part = {"ticker": np.array([ticker] * n, dtype=object), "date": item.dates(snap)}
            part.update({k: cols[k] for k in LONG})
            parts.append(part)
        names = ["ticker", "date", *LONG]
        table = {k: np.concatenate([p[k] for p in parts]) for k in names} if parts else {
            "ticker": np.array([], dtype=object), "date": np.array([], dtype="datetime64[D]"),
            **{k: np.array([], dtype=object if k == "lstar" else np.float64) for k in LONG},
        }  # fmt: skip
        return render(plan.format, table, headers=snap_headers(snap), filename="batch_lstar")
    results: dict[str, Any] = {}
    for ticker, item in plan.items.items():
        if isinstance(item, ApiError):
            results[ticker] = {"status": "error", "error": item.detail, "code": item.code}
        else:
            results[ticker] = {"status": "success", **columns_of(snap, item, threshold)}
    return document(snap, {"results": results})


LSTAR = Endpoint(
    path="/api/lstar",
    service="risk",
    price_key="lstar",
    params=LstarParams,
    plan=plan_lstar,
    size=size_lstar,
    tickers=series_ticker,
    render=render_lstar,
    threaded=True,
    doc=Doc(
        name="lstar",
        summary="The L* hedge level of each session (the real Service B's layout)",
        description=(
            "Column-wise over the last `years` years: `dates`, `lstar` (L1, L2 or L3: the level "
            "whose out-of-sample hedge left the least residual variance, lk_hq), that level's "
            "`market_hr`, `sector_hr`, `subsector_hr`, `total_er` (1 - its residual share), "
            "`residual_return`, and `l2_sector_er`, `l3_subsector_er`."
        ),
        responses=JSON_RESPONSES,
    ),
)
BATCH = Endpoint(
    path="/api/batch/lstar",
    method="POST",
    service="risk",
    price_key="batch/lstar",
    params=BatchLstarParams,
    plan=plan_batch,
    size=size_batch,
    tickers=served_tickers,
    render=render_batch,
    threaded=True,
    doc=Doc(
        name="batch_lstar",
        summary="L* of many tickers in one call",
        description=(
            "Per ticker the /api/lstar arrays (`results`, keyed by ticker, `status` success or "
            "error), or one long table in csv / parquet. Charged per succeeded ticker."
        ),
        responses={**ERRORS_NO_TICKER, **BODY_ERRORS},
    ),
)
