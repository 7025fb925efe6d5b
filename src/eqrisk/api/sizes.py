"""Sizes of Service B answers: rows, approximate bytes and the units a price multiplies.

Each `size_*` runs the route's own planner (`plans`) and counts what it would return, so the
estimate answers the same problem as the call (an unknown ticker is the same 404).
"""

from __future__ import annotations

from dataclasses import dataclass

from eqrisk.api.errors import ApiError
from eqrisk.api.fields import L3_COLUMNS, RETURNS_COLUMNS, TICKER_RETURNS_COLUMNS
from eqrisk.api.params import (
    BatchParams,
    EtfReturnsParams,
    HeatmapParams,
    L3Params,
    MetricsParams,
    ReturnsParams,
    TickerReturnsParams,
    TickersParams,
)
from eqrisk.api.plans import (
    SeriesPlan,
    plan_batch,
    plan_etf_returns,
    plan_heatmap,
    plan_l3,
    plan_metrics,
    plan_returns,
    plan_ticker_returns,
    plan_tickers,
)
from eqrisk.snapshot.versions import Snapshot


@dataclass(frozen=True)
class Size:
    units: int  # what the price multiplies: 1 per call, succeeded tickers for batch
    rows: int
    bytes: int
    note: str = ""


def _bytes(rows: int, n_float: int, fmt: str, n_text: int = 1) -> int:
    """Approximate body size: JSON ~32 bytes a number, CSV ~20, Parquet ~8 (compressed)."""
    per_cell = {"json": 32, "csv": 20, "parquet": 8}[fmt]
    overhead = {"json": 600, "csv": 400, "parquet": 2500}[fmt]
    return overhead + rows * (n_float * per_cell + n_text * (per_cell + 2))


def _series_size(plan: SeriesPlan, ncols: int, fmt: str | None) -> Size:
    return Size(1, plan.rows, _bytes(plan.rows, ncols, fmt or "json"))


def size_tickers(snap: Snapshot, p: TickersParams) -> Size:
    doc = plan_tickers(snap, p)
    rows = doc["count"]
    per = 200 if p.include_metadata else 80 if "results" in doc else 8
    return Size(1, rows, 300 + rows * per)


def size_metrics(snap: Snapshot, p: MetricsParams) -> Size:
    plan_metrics(snap, p)
    return Size(1, 1, 1500)


def size_ticker_returns(snap: Snapshot, p: TickerReturnsParams) -> Size:
    return _series_size(plan_ticker_returns(snap, p), len(TICKER_RETURNS_COLUMNS), p.format)


def size_returns(snap: Snapshot, p: ReturnsParams) -> Size:
    return _series_size(plan_returns(snap, p), len(RETURNS_COLUMNS), p.format)


def size_etf_returns(snap: Snapshot, p: EtfReturnsParams) -> Size:
    return _series_size(plan_etf_returns(snap, p), len(RETURNS_COLUMNS), p.format)


def size_l3(snap: Snapshot, p: L3Params) -> Size:
    return _series_size(plan_l3(snap, p), len(L3_COLUMNS), p.format)


def size_heatmap(snap: Snapshot, p: HeatmapParams) -> Size:
    rows = len(plan_heatmap(snap, p))
    return Size(1, rows, 600 + rows * 220)


def size_batch(snap: Snapshot, p: BatchParams) -> Size:
    """Rows: a day of a series (returns, l3_decomposition; the long table of csv / parquet)
    counts one, so does a latest-values object (full_metrics, hedge_ratios)."""
    plan = plan_batch(snap, p)
    rows = size = 0
    for item in plan.items.values():
        if isinstance(item, ApiError):
            size += 300
            continue
        if plan.format != "json":
            rows += item.rows
            size += _bytes(item.rows, 4, plan.format, 2)
            continue
        size += 1200  # hedge_levels and meta
        if "returns" in plan.metrics:
            rows += item.rows
            size += _bytes(item.rows, 7, "json")
        if "l3_decomposition" in plan.metrics:
            rows += item.rows
            size += _bytes(item.rows, 7, "json")
        for latest in ("hedge_ratios", "full_metrics"):
            if latest in plan.metrics:
                rows += 1
                size += 1500
    ok = plan.succeeded
    note = f"charged per succeeded ticker: {ok} of {len(plan.items)} requested tickers exist"
    return Size(ok, rows, size + 400, note)
