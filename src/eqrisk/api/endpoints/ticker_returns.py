"""`GET /api/ticker-returns`: daily returns with the L1/L2/L3 hedge ratios and explained risk."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import series_answer
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.fields import TICKER_RETURNS_COLUMNS
from eqrisk.api.models import SERIES_RESPONSES, TickerReturnsResponse
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
from eqrisk.api.plans import SeriesPlan, latest, plan_years, require_rows, series_ticker, span_name
from eqrisk.api.sizes import Size, series_size
from eqrisk.snapshot.versions import Snapshot


class TickerReturnsParams(VersionedParams):
    ticker: Ticker = Field(
        description="Ticker symbol (a stock or an ETF), case-insensitive.",
        examples=["NVDA", "AAPL", "SPY"],
    )
    years: Years = 1
    start: Start = None
    end: End = None
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)
    limit: int | None = Field(
        None,
        ge=1,
        description=(
            "Only the most recent `limit` rows of the window (the estimate counts the rows "
            "returned)."
        ),
    )
    nocache: bool = Field(
        False,
        description=(
            "true: render the answer anew, never a 304 or a cached body (the bytes are the "
            "same: answers are slices of the served snapshot, which never changes)."
        ),
    )


def plan_ticker_returns(snap: Snapshot, p: TickerReturnsParams) -> SeriesPlan:
    return latest(
        require_rows(snap, plan_years(snap, p.ticker, given_years(p), p.start, p.end)), p.limit
    )


def size(plan: SeriesPlan, p: TickerReturnsParams) -> Size:
    return series_size(plan, len(TICKER_RETURNS_COLUMNS), p.format)


def render(call: Call[TickerReturnsParams, SeriesPlan]) -> Response:
    p, plan = call.params, call.plan
    return series_answer(
        call.request,
        call.snap,
        call.fmt,
        plan,
        TICKER_RETURNS_COLUMNS,
        canonical={
            "ticker": plan.symbol.ticker,
            "from": plan.start,
            "to": plan.end,
            "limit": p.limit,
        },
        years=None if p.start is not None else p.years,
        filename=f"{plan.symbol.ticker}_ticker-returns_{span_name(p, plan)}",
        csv_comment=p.csv_comment,
        extra=lambda: {"asset_type": plan.symbol.asset_type},
        fresh=p.nocache,
    )


ENDPOINT = Endpoint(
    path="/api/ticker-returns",
    service="risk",
    price_key="ticker-returns",
    params=TickerReturnsParams,
    plan=plan_ticker_returns,
    size=size,
    tickers=series_ticker,
    formats=FORMATS,
    render=render,
    doc=Doc(
        name="ticker_returns",
        summary="Daily returns with L1/L2/L3 hedge ratios and explained risk",
        description=(
            "One row per session of the last `years` years (or from `start` to `end`) where the "
            "symbol has a price: gross "
            "and log returns, close, the hedge ratios and risk shares of each level, and each "
            "level's combined factor and residual returns. An ETF answers too (its market "
            "level; lower levels null). `limit`: only the most recent rows. JSON (with "
            "`asset_type` at the top level), CSV or Parquet (schema metadata: model_version, "
            "data_as_of); ETag / If-None-Match."
        ),
        response_model=TickerReturnsResponse,
        responses=SERIES_RESPONSES,
    ),
)
