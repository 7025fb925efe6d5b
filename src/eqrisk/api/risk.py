"""Service B, the risk metrics service (DESIGN section 4), under `/api`.

Every answer is sliced from the current snapshot (memory-mapped arrays, never a regression);
what a request asks for is decided by the `plan_*` functions of `estimates`, which the
pre-flight estimate shares, so the estimate and the charge of a call always agree.
Time-series routes answer JSON `{data, meta, _metadata}`, CSV or Parquet (rows only, metadata in
`X-Model-Version` / `X-Data-As-Of`), with an ETag; every answer from a snapshot carries
`X-Model-Version`.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the locally built
# query dependencies at runtime.

from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.responses import Response

from eqrisk.accounts.pricing import PriceTable
from eqrisk.api import estimates as est
from eqrisk.api.deps import RiskCaller, SnapshotDep
from eqrisk.api.errors import ApiError, problem_responses
from eqrisk.api.formats import cached, etag_for, json_response, negotiate, render, rows_of
from eqrisk.snapshot.store import Snapshot

router = APIRouter(prefix="/api", tags=["Service B: risk metrics"])

# --------------------------------------------------------------------------- auth, params

CallerDep = RiskCaller  # the caller the gate let in (documented security schemes)
P = TypeVar("P", bound=est.Params)


def query_of(model: type[P]) -> Any:
    """A dependency reading `model` from the query string: its fields are the documented
    parameters, and a parameter it does not know is a 400 that lists the accepted ones."""

    class Loose(model):  # type: ignore[valid-type,misc]
        model_config = ConfigDict(extra="ignore")

    Loose.__name__ = Loose.__qualname__ = model.__name__

    async def dependency(request: Request, params: Annotated[Loose, Query()]) -> P:
        est.reject_unknown(model, request.query_params.keys())
        return params  # type: ignore[return-value]

    return Depends(dependency)


async def _json_body(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            f"send a JSON body with Content-Type: application/json (got {media or 'none'})",
            accepted=["application/json"],
        )


JsonBody = Depends(_json_body)


def _prices(request: Request) -> PriceTable:
    prices = getattr(request.app.state, "prices", None)
    if prices is None:
        settings = request.app.state.settings
        prices = request.app.state.prices = PriceTable.load(settings.pricing_file)
    return prices


# --------------------------------------------------------------------------- response models

FIELD_DOCS: dict[str, str] = {
    "returns_gross": "Simple daily return P_t / P_t-1 - 1 (decimal); null after a missing price.",
    "returns_log": "Log return ln(1 + returns_gross).",
    "price_close": "Adjusted close.",
    "return_1d": "Simple return of the latest session (decimal).",
    "market_cap": "Market capitalization (USD).",
    "vol_23d": "Annualized volatility of daily returns over the last 23 sessions.",
    "vol_252d_ann": "Annualized volatility of daily returns over the last 252 sessions.",
    "l1_mkt_hr": "L1 hedge ratio: dollars of the market ETF per $1 of the symbol.",
    "l1_mkt_er": "L1 share of variance explained by the market (0 to 1).",
    "l1_res_er": "L1 residual share of variance (1 - l1_mkt_er).",
    "l2_mkt_hr": "L2 hedge ratio on the raw market ETF (hedging with market + sector ETFs).",
    "l2_sec_hr": "L2 hedge ratio on the sector ETF.",
    "l2_mkt_er": "L2 share of variance explained by the market.",
    "l2_sec_er": "L2 share explained by the sector ETF cleaned of the market.",
    "l2_res_er": "L2 residual share of variance.",
    "l3_mkt_hr": "L3 hedge ratio on the raw market ETF (hedging with all three ETFs).",
    "l3_sec_hr": "L3 hedge ratio on the raw sector ETF.",
    "l3_sub_hr": "L3 hedge ratio on the subsector ETF; null when the symbol has none.",
    "l3_mkt_er": "L3 share of variance explained by the market.",
    "l3_sec_er": "L3 share explained by the sector ETF cleaned of the market.",
    "l3_sub_er": "L3 share explained by the subsector ETF cleaned of market and sector.",
    "l3_res_er": "L3 residual (idiosyncratic) share; the non-null L3 shares sum to 1.",
    "l1_cfr": "L1 combined factor return: the hedge of day t-1 applied to day t's ETF returns.",
    "l1_rr": "L1 residual return: returns_gross - l1_cfr.",
    "l2_cfr": "L2 combined factor return.",
    "l2_rr": "L2 residual return: returns_gross - l2_cfr.",
    "l3_cfr": "L3 combined factor return.",
    "l3_rr": "L3 residual return: returns_gross - l3_cfr.",
}


class Metadata(BaseModel):
    model_version: str = Field(description="The snapshot version that answered.")
    data_as_of: date | None = Field(description="Last session of the snapshot.")
    universe_size: int
    data_source: str
    method: dict[str, Any] = Field(description="Estimation settings: window, min_obs, weighting.")


class Enveloped(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    metadata: Metadata = Field(alias="_metadata")


def _row_model(name: str, columns: Mapping[str, str]) -> type[BaseModel]:
    fields: dict[str, Any] = {"date": (date, Field(description="Session date, YYYY-MM-DD."))}
    for column in columns:
        fields[column] = (float | None, Field(description=FIELD_DOCS[column]))
    return create_model(name, **fields)


TickerReturnsRow = _row_model("TickerReturnsRow", est.TICKER_RETURNS_COLUMNS)
ReturnsRow = _row_model("ReturnsRow", est.RETURNS_COLUMNS)
L3Row = _row_model("L3DecompositionRow", est.L3_COLUMNS)
HedgeRatioRow = _row_model("HedgeRatioRow", est.HEDGE_RATIO_COLUMNS)
MetricValues = create_model(
    "MetricValues",
    **{name: (float | None, Field(description=FIELD_DOCS[name])) for name in est.METRICS_FIELDS},
)


class SymbolMeta(BaseModel):
    company_name: str
    sector: str | None
    industry: str | None
    asset_type: str
    market_etf: str | None
    sector_etf: str | None
    subsector_etf: str | None


class SeriesMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    ticker: str
    company_name: str
    asset_type: str
    market_etf: str | None
    sector_etf: str | None
    subsector_etf: str | None
    years: int | None = Field(None, description="The `years` asked for (year-based routes).")
    from_: date = Field(alias="from", description="First calendar date covered, inclusive.")
    to: date = Field(description="Last calendar date covered, inclusive.")
    rows: int = Field(description="Rows in `data`: sessions in the range with a price.")
    note: str | None = Field(None, description="Present when there are no rows, says why.")


class TickerReturnsResponse(Enveloped):
    data: list[TickerReturnsRow]  # type: ignore[valid-type]
    meta: SeriesMeta


class ReturnsResponse(Enveloped):
    data: list[ReturnsRow]  # type: ignore[valid-type]
    meta: SeriesMeta


class L3Response(Enveloped):
    data: list[L3Row]  # type: ignore[valid-type]
    meta: SeriesMeta


class MetricsBody(BaseModel):
    ticker: str
    teo: date | None = Field(description="Session of these values: the symbol's last price.")
    metrics: MetricValues  # type: ignore[valid-type]
    meta: SymbolMeta


class MetricsResponse(MetricsBody, Enveloped):
    pass


class TickerList(Enveloped):
    tickers: list[str]
    count: int


class SearchHit(BaseModel):
    ticker: str
    company_name: str
    sector: str | None
    asset_type: str


class SearchResults(Enveloped):
    query: str
    results: list[SearchHit]
    count: int


class HeatmapRow(BaseModel):
    ticker: str
    company_name: str
    sector: str | None
    industry: str | None
    market_cap: float | None
    return_1d: float | None = Field(description=FIELD_DOCS["return_1d"])
    teo: date = Field(description="Session of the values (the stock's last price).")


class HeatmapMeta(BaseModel):
    limit: int
    rows: int
    eligible: int = Field(description="Stocks that qualify (priced in the last sessions).")
    note: str | None = None


class HeatmapResponse(Enveloped):
    data: list[HeatmapRow]
    meta: HeatmapMeta


class ReturnPoint(BaseModel):
    date: date
    returns_gross: float | None


class BatchError(BaseModel):
    model_config = ConfigDict(extra="allow")

    error: str = Field(description="Machine code, e.g. TICKER_NOT_FOUND.")
    detail: str


class BatchItem(BaseModel):
    status: Literal["ok", "error"]
    error: BatchError | None = None
    returns: list[ReturnPoint] | None = None
    hedge_ratios: list[HedgeRatioRow] | None = None  # type: ignore[valid-type]
    full_metrics: MetricsBody | None = None


class BatchSummary(BaseModel):
    total: int
    succeeded: int
    failed: int


class BatchMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    years: int
    metrics: list[str]
    from_: date = Field(alias="from")
    to: date


class BatchResponse(Enveloped):
    results: dict[str, BatchItem]
    summary: BatchSummary
    meta: BatchMeta


class EstimateResponse(Enveloped):
    endpoint: str
    estimated_cost_usd: float
    estimated_tokens: int = Field(description="Exactly what a successful call is charged.")
    estimated_rows: int
    estimated_bytes: int = Field(description="Approximate body size.")
    unit_cost_usd: float
    pricing_model: str
    note: str


class HealthResponse(BaseModel):
    status: str
    model_version: str
    data_as_of: date | None


ERRORS = problem_responses(400, 401, 402, 403, 404, 429, "4XX", 500, 503)
ERRORS_NO_TICKER = {k: v for k, v in ERRORS.items() if k != 404}
BODY_ERRORS = problem_responses(415)
_META_HEADERS = {
    "X-Model-Version": {"description": "Snapshot version.", "schema": {"type": "string"}},
    "X-Data-As-Of": {"description": "Last session of the snapshot.", "schema": {"type": "string"}},
}
SERIES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "JSON `{data, meta, _metadata}`, or CSV / Parquet rows (an attachment).",
        "content": {
            "text/csv": {"schema": {"type": "string"}},
            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
        },
        "headers": {**_META_HEADERS, "ETag": {"schema": {"type": "string"}}},
    },
    304: {"description": "Not modified: If-None-Match named the current ETag."},
    **ERRORS,
}
JSON_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "OK", "headers": _META_HEADERS},
    **ERRORS,
}


# --------------------------------------------------------------------------- helpers


def _snap_headers(snap: Snapshot) -> dict[str, str]:
    return {"X-Model-Version": snap.version, "X-Data-As-Of": str(snap.manifest["data_as_of"])}


def _doc(snap: Snapshot, doc: dict[str, Any]) -> Response:
    return json_response({**doc, "_metadata": snap.metadata()}, headers=_snap_headers(snap))


def _safe(text: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in text)


def _series_meta(snap: Snapshot, plan: est.SeriesPlan, years: int | None) -> dict[str, Any]:
    sym = plan.symbol
    meta: dict[str, Any] = {
        "ticker": sym.ticker,
        "company_name": sym.company_name,
        "asset_type": sym.asset_type,
        "market_etf": sym.market_etf,
        "sector_etf": sym.sector_etf,
        "subsector_etf": sym.subsector_etf,
    }
    if years is not None:
        meta["years"] = years
    meta.update({"from": plan.start, "to": plan.end, "rows": plan.rows})
    if meta["rows"] == 0:
        if sym.first < 0:
            meta["note"] = f"{sym.ticker} has no prices in this snapshot"
        else:
            first, last = snap.sessions[sym.first], snap.sessions[sym.last]
            meta["note"] = (
                f"{sym.ticker} has no prices from {plan.start} to {plan.end} "
                f"(it is priced from {first} to {last})"
            )
    return meta


def _series_response(
    request: Request,
    snap: Snapshot,
    fmt_param: str | None,
    plan: est.SeriesPlan,
    columns: Mapping[str, str],
    *,
    canonical: Mapping[str, Any],
    years: int | None,
    filename: str,
) -> Response:
    fmt = negotiate(request, fmt_param, est.FORMATS)
    query = "&".join(f"{k}={v}" for k, v in sorted(canonical.items()))
    etag = etag_for(snap.version, request.url.path, query, fmt)
    headers = {**_snap_headers(snap), "Vary": "Accept"}

    def make() -> Response:
        cols = plan.columns(snap, columns)
        envelope = {"meta": _series_meta(snap, plan, years), "_metadata": snap.metadata()}
        return render(fmt, cols, envelope=envelope, headers=headers, filename=_safe(filename))

    return cached(request, etag, headers, make)


def _metrics_doc(snap: Snapshot, sym: est.Symbol) -> dict[str, Any]:
    t = sym.last
    if t < 0:
        values: dict[str, Any] = dict.fromkeys(est.METRICS_FIELDS)
        teo = None
    else:
        values = {
            name: float(snap.array(field)[sym.row, t]) for name, field in est.METRICS_FIELDS.items()
        }
        teo = snap.sessions[t].astype(object)
    return {"ticker": sym.ticker, "teo": teo, "metrics": values, "meta": sym.meta()}


# --------------------------------------------------------------------------- routes


@router.get(
    "/tickers",
    summary="List or search ticker symbols",
    description=(
        "Without parameters (or `array=ticker`): `{tickers}` sorted. `mag7=true`: the seven "
        "large caps. `search=q`: up to 10 `{ticker, company_name, sector, asset_type}`, exact "
        "symbol first, then symbol prefixes, then company names. `asset_type` filters any of "
        "these. Free."
    ),
    response_model=TickerList | SearchResults,
    responses=ERRORS_NO_TICKER,
)
async def tickers(
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.TickersParams, query_of(est.TickersParams)],
) -> Response:
    return _doc(snap, est.plan_tickers(snap, p))


@router.get(
    "/metrics/{ticker}",
    summary="Latest risk snapshot of one ticker",
    description=(
        "Volatility, price, market cap and the L1/L2/L3 hedge ratios and explained-risk shares "
        "on the symbol's latest priced session (`teo`)."
    ),
    response_model=MetricsResponse,
    responses=JSON_RESPONSES,
)
async def metrics(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    ticker: Annotated[
        str,
        PathParam(
            min_length=1,
            max_length=32,
            description="Ticker symbol, case-insensitive.",
            examples=["NVDA", "SPY"],
        ),
    ],
) -> Response:
    if request.query_params:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown parameter(s): {', '.join(sorted(request.query_params))}; this route takes "
            "no query parameters (the ticker is in the path)",
            parameters=sorted(request.query_params),
            accepted=[],
        )
    symbol = ticker.strip().upper()
    if not symbol:
        raise ApiError("INVALID_PARAMETER", "ticker must not be blank", parameter="ticker")
    sym = est.plan_metrics(snap, est.MetricsParams(ticker=symbol))
    return _doc(snap, _metrics_doc(snap, sym))


@router.get(
    "/ticker-returns",
    summary="Daily returns with L1/L2/L3 hedge ratios and explained risk",
    description=(
        "One row per session of the last `years` years where the symbol has a price: gross "
        "and log returns, close, the hedge ratios and risk shares of each level, and each "
        "level's combined factor and residual returns. An ETF answers too (its market level; "
        "lower levels null). JSON, CSV or Parquet; ETag / If-None-Match."
    ),
    response_model=TickerReturnsResponse,
    responses=SERIES_RESPONSES,
)
async def ticker_returns(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.TickerReturnsParams, query_of(est.TickerReturnsParams)],
) -> Response:
    plan = est.plan_ticker_returns(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        est.TICKER_RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "years": p.years},
        years=p.years,
        filename=f"{plan.symbol.ticker}_ticker-returns_{p.years}y",
    )


@router.get(
    "/returns",
    summary="Daily gross returns of a stock",
    description="Rows `{date, returns_gross}`; stocks only (ETFs: /api/etf-returns).",
    response_model=ReturnsResponse,
    responses=SERIES_RESPONSES,
)
async def returns(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.ReturnsParams, query_of(est.ReturnsParams)],
) -> Response:
    plan = est.plan_returns(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        est.RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "years": p.years},
        years=p.years,
        filename=f"{plan.symbol.ticker}_returns_{p.years}y",
    )


@router.get(
    "/etf-returns",
    summary="Daily gross returns of an ETF",
    description="Rows `{date, returns_gross}`; ETFs only (stocks: /api/returns). `etf=` works "
    "as `ticker=`.",
    response_model=ReturnsResponse,
    responses=SERIES_RESPONSES,
)
async def etf_returns(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.EtfReturnsParams, query_of(est.EtfReturnsParams)],
) -> Response:
    plan = est.plan_etf_returns(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        est.RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "years": p.years},
        years=p.years,
        filename=f"{plan.symbol.ticker}_etf-returns_{p.years}y",
    )


@router.get(
    "/l3-decomposition",
    summary="History of the L3 hedge ratios and risk shares",
    description=(
        "Rows `{date, l3_mkt_hr, l3_sec_hr, l3_sub_hr, l3_mkt_er, l3_sec_er, l3_sub_er, "
        "l3_res_er}` for the sessions from `from` to `to` (inclusive) where the symbol has a "
        "price. JSON, CSV or Parquet; ETag / If-None-Match."
    ),
    response_model=L3Response,
    responses=SERIES_RESPONSES,
)
async def l3_decomposition(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.L3Params, query_of(est.L3Params)],
) -> Response:
    plan = est.plan_l3(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        est.L3_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "from": plan.start, "to": plan.end},
        years=None,
        filename=f"{plan.symbol.ticker}_l3-decomposition_{plan.start}_{plan.end}",
    )


@router.post(
    "/estimate",
    summary="Pre-flight cost estimate (free)",
    description=(
        "What calling `endpoint` with `params` would cost now: `estimated_tokens` is exactly "
        "what the successful call is charged (1 token = 0.00002 USD). The parameters are "
        "checked as the endpoint checks them: bad ones are a 400, an unknown ticker a 404."
    ),
    response_model=EstimateResponse,
    responses={**JSON_RESPONSES, **BODY_ERRORS},
)
async def estimate(
    request: Request,
    caller: CallerDep,
    _json: Annotated[None, JsonBody],
    snap: SnapshotDep,
    body: est.EstimateRequest,
) -> Response:
    doc = est.estimate(body.endpoint, body.params, snap, _prices(request))
    return _doc(snap, doc)


@router.post(
    "/batch/analyze",
    summary="Analyze many tickers in one call",
    description=(
        "Per ticker (1 to 100, merged case-insensitively): `returns`, `hedge_ratios` and/or "
        "`full_metrics` over the last `years` years. An unknown ticker fails alone; the call "
        "is charged per succeeded ticker (minimum per call in the price table)."
    ),
    response_model=BatchResponse,
    responses={**ERRORS_NO_TICKER, **BODY_ERRORS},
)
def batch_analyze(
    caller: CallerDep,
    _json: Annotated[None, JsonBody],
    snap: SnapshotDep,
    body: est.BatchParams,
) -> Response:
    plan = est.plan_batch(snap, body)
    results: dict[str, Any] = {}
    for ticker, item in plan.items.items():
        if isinstance(item, ApiError):
            results[ticker] = {
                "status": "error",
                "error": {"error": item.code, "detail": item.detail, **item.context},
            }
            continue
        entry: dict[str, Any] = {"status": "ok"}
        if "returns" in plan.metrics:
            entry["returns"] = rows_of(item.columns(snap, est.RETURNS_COLUMNS))
        if "hedge_ratios" in plan.metrics:
            entry["hedge_ratios"] = rows_of(item.columns(snap, est.HEDGE_RATIO_COLUMNS))
        if "full_metrics" in plan.metrics:
            entry["full_metrics"] = _metrics_doc(snap, item.symbol)
        results[ticker] = entry
    idx = est.symbol_index(snap)
    _, _, start, end = idx.window(plan.years)
    ok = plan.succeeded
    return _doc(
        snap,
        {
            "results": results,
            "summary": {"total": len(results), "succeeded": ok, "failed": len(results) - ok},
            "meta": {"years": plan.years, "metrics": list(plan.metrics), "from": start, "to": end},
        },
    )


@router.get(
    "/heatmap",
    summary="Largest stocks with their latest return, for a treemap",
    description=(
        "The top `limit` stocks by market cap on their latest session (stocks priced in the "
        f"last {est.HEATMAP_RECENT_SESSIONS} sessions and with a market cap), largest first."
    ),
    response_model=HeatmapResponse,
    responses=ERRORS_NO_TICKER,
)
async def heatmap(
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[est.HeatmapParams, query_of(est.HeatmapParams)],
) -> Response:
    idx = est.symbol_index(snap)
    pos = est.plan_heatmap(snap, p)
    syms = [idx.symbols[idx.tickers[i]] for i in pos.tolist()]
    columns = {
        "ticker": [s.ticker for s in syms],
        "company_name": [s.company_name for s in syms],
        "sector": [s.sector for s in syms],
        "industry": [s.industry for s in syms],
        "market_cap": idx.latest_cap[pos],
        "return_1d": idx.latest_return[pos],
        "teo": idx.sessions[np.array([s.last for s in syms], dtype=np.int64)],
    }
    meta: dict[str, Any] = {
        "limit": p.limit,
        "rows": len(syms),
        "eligible": len(idx.heatmap_order),
    }
    if not syms:
        meta["note"] = "no stock with a market cap was priced in the last sessions"
    return _doc(snap, {"data": rows_of(columns), "meta": meta})


@router.get(
    "/health",
    summary="Liveness and the served model version (no key needed)",
    response_model=HealthResponse,
    responses={503: ERRORS[503], 500: ERRORS[500]},
)
async def health(snap: SnapshotDep) -> Response:
    return json_response(
        {"status": "ok", "model_version": snap.version, "data_as_of": snap.manifest["data_as_of"]},
        headers=_snap_headers(snap),
    )
