"""Service B, the risk metrics service (DESIGN section 4), under `/api`.

Every answer is sliced from the current snapshot (memory-mapped arrays, never a regression);
what a request asks for is decided by the `plan_*` functions of `plans`, which the
pre-flight estimate shares, so the estimate and the charge of a call always agree.
Time-series routes answer JSON `{data, meta, _metadata}`, CSV or Parquet (rows only, metadata in
`X-Model-Version` / `X-Data-As-Of`), with an ETag; every answer from a snapshot carries
`X-Model-Version`.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations of the locally built
# query dependencies at runtime.

from collections.abc import Callable, Mapping
from typing import Annotated, Any
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from starlette.responses import Response

from eqrisk.accounts.pricing import PriceTable
from eqrisk.api import wire
from eqrisk.api.deps import RiskCaller, SnapshotDep
from eqrisk.api.errors import ApiError
from eqrisk.api.estimate import estimate as estimate_of
from eqrisk.api.fields import L3_COLUMNS, RETURNS_COLUMNS, TICKER_RETURNS_COLUMNS
from eqrisk.api.formats import (
    CSV,
    JSON,
    JSON_COLUMNS,
    answer,
    json_response,
    negotiate,
    render,
    rows_of,
)
from eqrisk.api.models import (
    BODY_ERRORS,
    ERRORS,
    ERRORS_NO_TICKER,
    JSON_RESPONSES,
    SERIES_RESPONSES,
    BatchResponse,
    EstimateResponse,
    HealthResponse,
    HeatmapResponse,
    L3Response,
    MetricsResponse,
    ReturnsResponse,
    SearchResults,
    TickerList,
    TickerReturnsResponse,
)
from eqrisk.api.params import (
    FORMATS,
    BatchParams,
    EstimateRequest,
    EtfReturnsParams,
    HeatmapParams,
    L3Params,
    MetricsParams,
    NoQuery,
    ReturnsParams,
    TickerReturnsParams,
    TickersParams,
    query_of,
    validate_params,
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
from eqrisk.data.master import MAG7
from eqrisk.snapshot.index import RECENT_SESSIONS, Symbol
from eqrisk.snapshot.versions import Snapshot

router = APIRouter(prefix="/api", tags=["Service B: risk metrics"])

# --------------------------------------------------------------------------- auth, params

CallerDep = RiskCaller  # the caller the gate let in (documented security schemes)


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


# --------------------------------------------------------------------------- helpers


def _snap_headers(snap: Snapshot) -> dict[str, str]:
    """Lineage headers: `X-Risk-Model-Version` is the name the real Service B's clients read;
    `X-Model-Version` stays for eqrisk's own readers."""
    return {
        "X-Model-Version": snap.version,
        "X-Risk-Model-Version": snap.version,
        "X-Data-As-Of": str(snap.manifest["data_as_of"]),
        "X-Universe-Size": str(snap.manifest["universe_size"]),
    }


def _doc(snap: Snapshot, doc: dict[str, Any]) -> Response:
    return json_response({**doc, "_metadata": snap.metadata()}, headers=_snap_headers(snap))


def _safe(text: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in text)


def _series_meta(snap: Snapshot, plan: SeriesPlan, years: int | None) -> dict[str, Any]:
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
    if meta["rows"] == 0:  # only a range without sessions gets here (else NO_DATA)
        sessions = snap.sessions
        span = f"{sessions[0]} to {sessions[-1]}" if len(sessions) else "no sessions"
        meta["note"] = (
            f"no session of the data set from {plan.start} to {plan.end} (it covers {span})"
        )
    return meta


def _series_response(
    request: Request,
    snap: Snapshot,
    fmt_param: str | None,
    plan: SeriesPlan,
    columns: Mapping[str, str],
    *,
    canonical: Mapping[str, Any],
    years: int | None,
    filename: str,
    extra: Callable[[], dict[str, Any]] | None = None,
    csv_comment: bool = False,
    fresh: bool = False,
) -> Response:
    """A series answer; `extra()` adds top-level keys to the JSON envelope only, `csv_comment`
    a lineage comment line to a CSV answer."""
    fmt = negotiate(request, fmt_param, FORMATS)
    comment = csv_comment and fmt == CSV

    def envelope() -> dict[str, Any]:
        json = fmt in (JSON, JSON_COLUMNS)
        added: dict[str, Any] = extra() if extra is not None and json else {}
        if comment:
            added["csv_comment"] = True
        return {**added, "meta": _series_meta(snap, plan, years), "_metadata": snap.metadata()}

    return answer(
        request,
        fmt,
        version=snap.version,
        canonical=[*canonical.items(), ("csv_comment", comment)],
        headers={**_snap_headers(snap), "Vary": "Accept"},
        make=lambda: plan.columns(snap, columns),
        envelope=envelope,
        filename=_safe(filename),
        fresh=fresh,
    )


def _metrics_doc(snap: Snapshot, sym: Symbol) -> dict[str, Any]:
    """The latest values of a priced symbol (the plans refuse one that was never priced), how
    far its last price lies behind the snapshot's data_as_of, and its `hedge_levels`."""
    values = wire.latest_values(snap, sym)
    teo = snap.sessions[sym.last].astype(object)
    behind = snap.index.sessions_behind(sym)
    return {
        "ticker": sym.ticker,
        "teo": teo,
        "stale": bool(behind),
        "last_session": teo,
        "sessions_behind": behind,
        "metrics": values,
        "hedge_levels": wire.hedge_levels(sym, values),
        "meta": sym.meta(),
    }


# --------------------------------------------------------------------------- routes


@router.get(
    "/tickers",
    summary="List or search ticker symbols",
    description=(
        "Without parameters (or `array=ticker`): `{tickers}` sorted. `mag7=true`: the seven "
        "large caps. `search=q`: up to 10 `{ticker, company_name, sector, asset_type}`, exact "
        "symbol first, then symbol prefixes, then company names, under `tickers` (where the "
        "real Service B's readers look) and `results`. `include_metadata=true`: rows are "
        "objects with the symbol's names and hedge ETFs. `asset_type` filters any of these. "
        "Free."
    ),
    response_model=TickerList | SearchResults,
    responses=ERRORS_NO_TICKER,
)
async def tickers(
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[TickersParams, query_of(TickersParams)],
) -> Response:
    return _doc(snap, plan_tickers(snap, p))


@router.get(
    "/metrics/{ticker}",
    summary="Latest risk snapshot of one ticker",
    description=(
        "Volatility, price, market cap, the L1/L2/L3 hedge ratios, explained-risk shares and "
        "per-level betas on the symbol's latest priced session (`teo`), and the same values "
        "as `hedge_levels` (a block per level with its `hedge_etfs`). A hedge ratio is dollars "
        "of ETF per $1 of stock with the regression-coefficient sign: the market HR at L2/L3 "
        "is often negative. A symbol whose last price is older than the snapshot's "
        "`data_as_of` (delisted, halted) says so: `stale: true`, its `last_session` and "
        "`sessions_behind`."
    ),
    response_model=MetricsResponse,
    responses=JSON_RESPONSES,
)
async def metrics(
    caller: CallerDep,
    snap: SnapshotDep,
    _query: Annotated[NoQuery, query_of(NoQuery)],
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
    sym = plan_metrics(snap, validate_params(MetricsParams, {"ticker": ticker}, ("path",)))
    return _doc(snap, _metrics_doc(snap, sym))


@router.get(
    "/ticker-returns",
    summary="Daily returns with L1/L2/L3 hedge ratios and explained risk",
    description=(
        "One row per session of the last `years` years where the symbol has a price: gross "
        "and log returns, close, the hedge ratios and risk shares of each level, and each "
        "level's combined factor and residual returns. An ETF answers too (its market level; "
        "lower levels null). `limit`: only the most recent rows. JSON (with `asset_type` at "
        "the top level), CSV or Parquet (schema metadata: model_version, data_as_of); "
        "ETag / If-None-Match."
    ),
    response_model=TickerReturnsResponse,
    responses=SERIES_RESPONSES,
)
async def ticker_returns(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[TickerReturnsParams, query_of(TickerReturnsParams)],
) -> Response:
    plan = plan_ticker_returns(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        TICKER_RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "years": p.years, "limit": p.limit},
        years=p.years,
        filename=f"{plan.symbol.ticker}_ticker-returns_{p.years}y",
        csv_comment=p.csv_comment,
        extra=lambda: {"asset_type": plan.symbol.asset_type},
        fresh=p.nocache,
    )


def _returns_response(
    request: Request,
    snap: Snapshot,
    p: ReturnsParams | EtfReturnsParams,
    plan: SeriesPlan,
    route: str,
) -> Response:
    """`/api/returns` and `/api/etf-returns` answer the same rows; only the file name differs."""
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "years": p.years},
        years=p.years,
        filename=f"{plan.symbol.ticker}_{route}_{p.years}y",
        csv_comment=p.csv_comment,
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
    p: Annotated[ReturnsParams, query_of(ReturnsParams)],
) -> Response:
    return _returns_response(request, snap, p, plan_returns(snap, p), "returns")


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
    p: Annotated[EtfReturnsParams, query_of(EtfReturnsParams)],
) -> Response:
    return _returns_response(request, snap, p, plan_etf_returns(snap, p), "etf-returns")


@router.get(
    "/l3-decomposition",
    summary="History of the L3 hedge ratios and risk shares",
    description=(
        "The sessions from `from` (or the last `years` years) to `to`, inclusive, where the "
        "symbol has a price. JSON: the real Service B's column layout `{dates, l3_market_hr, "
        "l3_sector_hr, l3_subsector_hr, l3_market_er, l3_sector_er, l3_subsector_er, "
        "l3_residual_er}` beside the rows `data` in short names; CSV or Parquet: the rows. "
        "`market_factor_etf` may only name the snapshot's market ETF. ETag / If-None-Match."
    ),
    response_model=L3Response,
    responses=SERIES_RESPONSES,
)
async def l3_decomposition(
    request: Request,
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[L3Params, query_of(L3Params)],
) -> Response:
    plan = plan_l3(snap, p)
    return _series_response(
        request,
        snap,
        p.format,
        plan,
        L3_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "from": plan.start, "to": plan.end},
        years=p.years,
        filename=f"{plan.symbol.ticker}_l3-decomposition_{plan.start}_{plan.end}",
        csv_comment=p.csv_comment,
        extra=lambda: wire.l3_columns(snap, plan),
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
    body: EstimateRequest,
) -> Response:
    doc = estimate_of(body.endpoint, body.params, snap, _prices(request))
    return _doc(snap, doc)


@router.post(
    "/batch/analyze",
    summary="Analyze many tickers in one call",
    description=(
        "Per ticker (1 to 100, merged case-insensitively), in the real Service B's shape: "
        '`results` keyed by ticker; a succeeded entry has `status: "success"`, the asked '
        "`returns` (column-wise), `hedge_ratios` (latest), `full_metrics` (flat), "
        "`l3_decomposition`, and always `hedge_levels` and `meta`; a failed one `status: "
        '"error"`, `error` (the sentence) and `code`, and it is not charged. `format` parquet '
        "or csv answers one long table (ticker, date, returns_gross, L3 hedge ratios). Charged "
        "per succeeded ticker (minimum per call in the price table)."
    ),
    response_model=BatchResponse,
    responses={**ERRORS_NO_TICKER, **BODY_ERRORS},
)
def batch_analyze(
    caller: CallerDep,
    _json: Annotated[None, JsonBody],
    snap: SnapshotDep,
    body: BatchParams,
) -> Response:
    plan = plan_batch(snap, body)
    if plan.format != JSON:
        # Percent-encoded: a header carries latin-1 only, and a ticker as asked may be anything.
        failed = [quote(t, safe="") for t, item in plan.items.items() if isinstance(item, ApiError)]
        return render(
            plan.format,
            wire.long_table(snap, plan),
            envelope={"_metadata": snap.metadata(), "csv_comment": body.csv_comment},
            headers={**_snap_headers(snap), "X-Failed-Tickers": ",".join(failed)},
            filename=f"batch_{plan.years}y",
        )
    results = wire.batch_results(snap, plan)
    idx = snap.index
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
        f"last {RECENT_SESSIONS} sessions and with a market cap), largest first. "
        "No such stock (for example a data set without market caps) is a 404 NO_DATA that "
        "says what is missing; it is not charged."
    ),
    response_model=HeatmapResponse,
    responses=ERRORS,
)
async def heatmap(
    caller: CallerDep,
    snap: SnapshotDep,
    p: Annotated[HeatmapParams, query_of(HeatmapParams)],
) -> Response:
    idx = snap.index
    pos = plan_heatmap(snap, p)
    eligible = idx.heatmap_order
    if caller.is_demo:  # the demo key sees its seven tickers (gate.py's demo rules), not the market
        eligible = eligible[np.isin(idx.ticker_array[eligible], MAG7)]
        pos = eligible[: p.limit]
        if not len(pos):
            raise ApiError(
                "NO_DATA",
                f"none of the demo key's tickers ({', '.join(MAG7)}) has a market cap priced in "
                f"the last {RECENT_SESSIONS} sessions",
                missing="market_cap",
            )
    syms = [idx.symbols[idx.tickers[i]] for i in pos.tolist()]
    behind = np.array([idx.sessions_behind(s) for s in syms], dtype=np.int64)
    columns = {
        "ticker": [s.ticker for s in syms],
        "company_name": [s.company_name for s in syms],
        "sector": [s.sector for s in syms],
        "industry": [s.industry for s in syms],
        "market_cap": idx.latest_cap[pos],
        "return_1d": idx.latest_return[pos],
        "teo": idx.sessions[np.array([s.last for s in syms], dtype=np.int64)],
        "stale": behind > 0,
        "sessions_behind": behind,
    }
    meta: dict[str, Any] = {
        "limit": p.limit,
        "rows": len(syms),
        "eligible": len(eligible),
    }
    if caller.is_demo:
        meta["restricted_to"] = list(MAG7)
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
