"""`GET /api/returns` and `GET /api/etf-returns`: the daily gross returns of a stock, of an ETF
(the same rows; each route refuses the other's asset type and names it)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import series_answer
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import RETURNS_COLUMNS
from eqrisk.api.models import SERIES_RESPONSES, ReturnsResponse
from eqrisk.api.params import (
    CSV_COMMENT_DESCRIPTION,
    FORMAT_DESCRIPTION,
    FORMATS,
    End,
    Format,
    Start,
    Ticker,
    VersionedParams,
    Years,
    given_years,
)
from eqrisk.api.plans import (
    SeriesPlan,
    plan_years,
    require_rows,
    require_type,
    series_ticker,
    span_name,
)
from eqrisk.api.sizes import Size, series_size
from eqrisk.snapshot.versions import Snapshot


class ReturnsParams(VersionedParams):
    ticker: Ticker = Field(
        description="Stock ticker, case-insensitive (ETFs: /api/etf-returns).",
        examples=["NVDA", "AAPL"],
    )
    years: Years = 1
    start: Start = None
    end: End = None
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


class EtfReturnsParams(VersionedParams):
    ticker: Ticker | None = Field(
        None, description="ETF ticker, case-insensitive.", examples=["SPY", "XLK"]
    )
    etf: Ticker | None = Field(None, description="Same as `ticker` (give one of the two).")
    years: Years = 1
    start: Start = None
    end: End = None
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


def plan_returns(snap: Snapshot, p: ReturnsParams) -> SeriesPlan:
    plan = plan_years(snap, p.ticker, given_years(p), p.start, p.end)
    require_type(plan.symbol, "stock", "/api/returns")
    return require_rows(snap, plan)


def etf_ticker(p: EtfReturnsParams) -> str:
    if p.ticker is None and p.etf is None:
        raise ApiError(
            "MISSING_PARAMETER",
            "missing required parameter: ticker (or etf)",
            parameters=["ticker"],
        )
    if p.ticker is not None and p.etf is not None and p.ticker != p.etf:
        raise ApiError(
            "INVALID_PARAMETER",
            f"ticker={p.ticker} and etf={p.etf} disagree; give one of the two",
            parameters=["ticker", "etf"],
        )
    return p.ticker or p.etf  # type: ignore[return-value]


def plan_etf_returns(snap: Snapshot, p: EtfReturnsParams) -> SeriesPlan:
    plan = plan_years(snap, etf_ticker(p), given_years(p), p.start, p.end)
    require_type(plan.symbol, "etf", "/api/etf-returns")
    return require_rows(snap, plan)


def size(plan: SeriesPlan, p: ReturnsParams | EtfReturnsParams) -> Size:
    return series_size(plan, len(RETURNS_COLUMNS), p.format)


def _answer(
    call: Call[ReturnsParams, SeriesPlan] | Call[EtfReturnsParams, SeriesPlan], route: str
) -> Response:
    """Both routes answer the same rows; only the file name differs."""
    p, plan = call.params, call.plan
    return series_answer(
        call.request,
        call.snap,
        call.fmt,
        plan,
        RETURNS_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "from": plan.start, "to": plan.end},
        years=None if p.start is not None else p.years,
        filename=f"{plan.symbol.ticker}_{route}_{span_name(p, plan)}",
        csv_comment=p.csv_comment,
    )


def render_returns(call: Call[ReturnsParams, SeriesPlan]) -> Response:
    return _answer(call, "returns")


def render_etf_returns(call: Call[EtfReturnsParams, SeriesPlan]) -> Response:
    return _answer(call, "etf-returns")


RETURNS = Endpoint(
    path="/api/returns",
    service="risk",
    price_key="returns",
    params=ReturnsParams,
    plan=plan_returns,
    size=size,
    tickers=series_ticker,
    formats=FORMATS,
    render=render_returns,
    doc=Doc(
        name="returns",
        summary="Daily gross returns of a stock",
        description="Rows `{date, returns_gross}`; stocks only (ETFs: /api/etf-returns).",
        response_model=ReturnsResponse,
        responses=SERIES_RESPONSES,
    ),
)

ETF_RETURNS = Endpoint(
    path="/api/etf-returns",
    service="risk",
    price_key="etf-returns",
    params=EtfReturnsParams,
    plan=plan_etf_returns,
    size=size,
    tickers=series_ticker,
    formats=FORMATS,
    render=render_etf_returns,
    doc=Doc(
        name="etf_returns",
        summary="Daily gross returns of an ETF",
        description="Rows `{date, returns_gross}`; ETFs only (stocks: /api/returns). `etf=` "
        "works as `ticker=`.",
        response_model=ReturnsResponse,
        responses=SERIES_RESPONSES,
    ),
)
