"""`POST /api/correlation` and `GET /api/metrics/{ticker}/correlation`: correlations of a stock's
daily (residual) returns with the real Service B's macro and style factors
(`api/macro_factors.py`; docs/decisions/drop-in-routes.md, "Macro factors")."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api import macro_factors as mf
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import BODY_ERRORS, JSON_RESPONSES
from eqrisk.api.params import BodyParams, Ticker, VersionedParams, path_and_query
from eqrisk.api.plans import lookup, resolve, ticker_not_found
from eqrisk.api.sizes import Size
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot

MAX_CORRELATION_TICKERS = 50
ReturnType = Literal["gross", "l1", "l2", "l3_residual"]
Method = Literal["pearson", "spearman"]
# return_type -> the snapshot array of the stock's series
STOCK_SERIES = {"gross": "return", "l1": "l1_rr", "l2": "l2_rr", "l3_residual": "l3_rr"}
RETURN_TYPE_DOC = (
    "gross (the daily return) or the residual after the previous session's hedge at l1, l2 "
    "or l3_residual (default), as in /api/ticker-returns' l1_rr, l2_rr, l3_rr."
)


class CorrelationQuery(VersionedParams):
    factors: str | None = Field(
        None, max_length=2000, description="Factor keys, comma-separated (default: all 18)."
    )
    factor: str | None = Field(None, max_length=2000, description="Same as `factors`.")
    return_type: ReturnType = Field("l3_residual", description=RETURN_TYPE_DOC)
    window_days: int = Field(252, ge=20, le=2000, description="The last N paired sessions.")
    method: Method = Field("pearson", description="pearson or spearman (average ranks).")


class CorrelationParams(CorrelationQuery):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


class CorrelationBody(BodyParams, VersionedParams):
    ticker: Ticker | list[Ticker] = Field(
        description=f"One ticker, or a list of 1 to {MAX_CORRELATION_TICKERS}.",
        examples=["NVDA", ["NVDA", "AAPL"]],
    )
    factors: list[str] | None = Field(
        None, max_length=40, description="Factor keys (default: all 18)."
    )
    return_type: ReturnType = Field("l3_residual", description=RETURN_TYPE_DOC)
    window_days: int = Field(252, ge=20, le=2000, description="The last N paired sessions.")
    method: Method = Field("pearson", description="pearson or spearman (average ranks).")


@dataclass(frozen=True)
class CorrelationPlan:
    items: dict[str, Symbol | ApiError]  # per ticker asked, in order
    keys: list[str]
    unknown: list[str]
    batch: bool

    @property
    def served(self) -> tuple[str, ...]:
        return tuple(s.ticker for s in self.items.values() if isinstance(s, Symbol))


def _keys(given: str | list[str] | None) -> tuple[list[str], list[str]]:
    keys, unknown = mf.parse_keys(given)
    if not keys:
        raise ApiError(
            "INVALID_PARAMETER",
            f"no known factor key in {unknown}; accepted: {', '.join(mf.DEFAULT_KEYS)}",
            parameter="factors",
            accepted=list(mf.DEFAULT_KEYS),
        )
    return keys, unknown


def check_symbol(snap: Snapshot, sym: Symbol, return_type: str) -> Symbol:
    """The vendor's 400 for a residual the symbol has no level for, 404 under 30 returns."""
    if return_type in ("l2", "l3_residual") and sym.sector_etf is None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{sym.ticker} has no sector ETF, so no {return_type} residual; use return_type "
            "gross or l1",
            parameter="return_type",
            accepted=["gross", "l1"],
        )
    # Decided from the priced span (the plan reads no row): fewer residuals than returns
    # (a level not yet published) give null correlations with a warning instead.
    if sym.last < 0 or sym.last - sym.first < mf.MIN_PAIRS:
        raise ApiError(
            "NO_DATA",
            f"{sym.ticker} has fewer than {mf.MIN_PAIRS} daily returns",
            ticker=sym.ticker,
        )
    return sym


def plan_single(snap: Snapshot, p: CorrelationParams) -> CorrelationPlan:
    if p.factors is not None and p.factor is not None:
        raise ApiError(
            "INVALID_PARAMETER",
            "factors and factor are the same parameter; give one of the two",
            parameters=["factors", "factor"],
        )
    keys, unknown = _keys(p.factors if p.factors is not None else p.factor)
    sym = check_symbol(snap, lookup(snap.index, p.ticker), p.return_type)
    return CorrelationPlan({p.ticker: sym}, keys, unknown, False)


def plan_body(snap: Snapshot, p: CorrelationBody) -> CorrelationPlan:
    keys, unknown = _keys(p.factors)
    if isinstance(p.ticker, str):
        sym = check_symbol(snap, lookup(snap.index, p.ticker), p.return_type)
        return CorrelationPlan({p.ticker: sym}, keys, unknown, False)
    asked = list(dict.fromkeys(p.ticker))
    if not 1 <= len(asked) <= MAX_CORRELATION_TICKERS:
        raise ApiError(
            "INVALID_PARAMETER",
            f"ticker lists 1 to {MAX_CORRELATION_TICKERS} tickers; got {len(asked)}",
            parameter="ticker",
        )
    items: dict[str, Symbol | ApiError] = {}
    for name in asked:
        try:
            found = resolve(snap.index, name)
            if found is None:
                raise ticker_not_found(snap.index, [name])
            items[name] = check_symbol(snap, found, p.return_type)
        except ApiError as err:
            items[name] = err
    return CorrelationPlan(items, keys, unknown, True)


def size(plan: CorrelationPlan, p: Any) -> Size:
    n = len(plan.items)
    return Size(1, n * len(plan.keys), 400 + n * (300 + 40 * len(plan.keys)))


def correlations(
    snap: Snapshot, sym: Symbol, keys: list[str], unknown: list[str], p: Any
) -> dict[str, Any]:
    """The vendor's single-ticker object: `correlations` per key (null: no series or under 30
    pairs), `overlap_days` (the most pairs used), `warnings`; and eqrisk's `sources`: per key,
    the ETF read (null: none in the data) and the vendor's ETF it stands in for, if a proxy."""
    stock = np.asarray(snap.array(STOCK_SERIES[p.return_type])[sym.row], dtype=np.float64)
    warnings = [f"unknown factor key dropped: {name}" for name in unknown]
    if p.return_type == "l3_residual" and sym.subsector_etf is None:
        warnings.append(f"{sym.ticker} has no subsector ETF: its L3 residual is the L2 one")
    out: dict[str, float | None] = {}
    sources: dict[str, dict[str, str | None]] = {}
    overlap = loaded = 0
    for key in keys:
        series = mf.series_of(snap, key)
        sources[key] = {
            "etf": series.etf,
            "proxy_for": mf.BY_KEY[key].etfs[0] if series.proxy else None,
        }
        if series.warning:
            warnings.append(series.warning)
        if series.row is None:
            out[key] = None
            continue
        loaded += 1
        value, pairs = mf.correlation(
            stock, mf.factor_returns(snap, series), p.window_days, p.method
        )
        if value is None and pairs < mf.MIN_PAIRS:
            warnings.append(f"{key}: {pairs} overlapping returns, fewer than {mf.MIN_PAIRS}")
        out[key] = value
        overlap = max(overlap, pairs if value is not None else 0)
    if all(v is None for v in out.values()):
        warnings.append("every factor is null: no factor series overlaps this stock's returns")
    return {
        "ticker": sym.ticker,
        "return_type": p.return_type,
        "window_days": p.window_days,
        "method": p.method,
        "correlations": out,
        "overlap_days": overlap,
        "warnings": warnings,
        "stock_series_length": int(np.isfinite(stock).sum()),
        "macro_factors_loaded": loaded,
        "sources": sources,
    }


def render(call: Call[Any, CorrelationPlan]) -> Response:
    snap, plan, p = call.snap, call.plan, call.params
    if not plan.batch:
        (sym,) = plan.items.values()
        assert isinstance(sym, Symbol)
        return document(snap, correlations(snap, sym, plan.keys, plan.unknown, p))
    results: list[dict[str, Any]] = []
    for name, item in plan.items.items():
        if isinstance(item, ApiError):
            results.append(
                {"ticker": name, "error": item.detail, "code": item.code, "status": item.status}
            )
        else:
            results.append(correlations(snap, item, plan.keys, plan.unknown, p))
    return document(snap, {"results": results})


DESCRIPTION = (
    " Per factor: the last `window_days` sessions where both the stock's series and the "
    "factor's ETF return exist; under 30 such sessions, or a factor whose ETF the data set "
    "lacks, is null with a warning. The residual series are eqrisk's out-of-sample residuals "
    "(the previous session's hedge), where the vendor uses the same day's hedge ratios."
)

POST = Endpoint(
    path="/api/correlation",
    method="POST",
    service="risk",
    price_key="correlation",
    params=CorrelationBody,
    plan=plan_body,
    size=size,
    tickers=lambda plan: plan.served,
    render=render,
    threaded=True,
    doc=Doc(
        name="correlation",
        summary="Correlations of stocks' returns with macro and style factors",
        description=(
            "One ticker: `{ticker, return_type, window_days, method, correlations, "
            "overlap_days, warnings, stock_series_length, macro_factors_loaded, sources}` "
            "(`sources`: per factor, the ETF read and `proxy_for`, the vendor's ETF a proxy "
            "stands in for); a list: "
            "`{results: [...]}` in request order, a failed ticker `{ticker, error, status}`. "
            "One price per request." + DESCRIPTION
        ),
        responses={**JSON_RESPONSES, **BODY_ERRORS},
    ),
)
SINGLE = POST.variant(
    path="/api/metrics/{ticker}/correlation",
    method="GET",
    price_key="metrics/correlation",
    params=CorrelationParams,
    reader=path_and_query(CorrelationQuery, CorrelationParams),
    plan=plan_single,
    doc=Doc(
        name="metrics_correlation",
        summary="Correlations of one stock's returns with macro and style factors",
        description="The single-ticker answer of POST /api/correlation." + DESCRIPTION,
        responses=JSON_RESPONSES,
    ),
)
