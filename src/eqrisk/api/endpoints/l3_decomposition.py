"""`GET /api/l3-decomposition`: the history of the L3 hedge ratios and risk shares."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from datetime import date

from pydantic import Field
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import series_answer
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import L3_COLUMNS
from eqrisk.api.models import SERIES_RESPONSES, L3Response
from eqrisk.api.params import (
    CSV_COMMENT_DESCRIPTION,
    FORMAT_DESCRIPTION,
    FORMATS,
    Format,
    IsoDate,
    Ticker,
    VersionedParams,
)
from eqrisk.api.plans import (
    SeriesPlan,
    lookup,
    market_etfs,
    require_rows,
    series_plan,
    series_ticker,
)
from eqrisk.api.sizes import Size, series_size
from eqrisk.snapshot.index import MAX_YEARS, SymbolIndex, minus_years
from eqrisk.snapshot.versions import Snapshot


class L3Params(VersionedParams):
    ticker: Ticker = Field(
        description="Ticker symbol, case-insensitive.", examples=["NVDA", "AAPL", "SPY"]
    )
    from_: IsoDate | None = Field(
        None,
        alias="from",
        description="First date, inclusive, YYYY-MM-DD (default: one year before data_as_of).",
    )
    to: IsoDate | None = Field(
        None, description="Last date, inclusive, YYYY-MM-DD (default: data_as_of)."
    )
    start: IsoDate | None = Field(
        None, description="Same as `from` (the name the other time-series routes use)."
    )
    end: IsoDate | None = Field(None, description="Same as `to`.")
    years: int | None = Field(
        None,
        ge=1,
        le=MAX_YEARS,
        description=(
            "The last `years` years up to data_as_of (as /api/ticker-returns); instead of "
            "`from` (give one of the two)."
        ),
    )
    market_factor_etf: Ticker | None = Field(
        None,
        description=(
            "The market ETF of the decomposition; only the snapshot's market ETF (SPY) is "
            "served, any other is a 400."
        ),
    )
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)
    csv_comment: bool = Field(False, description=CSV_COMMENT_DESCRIPTION)


def check_market_etf(idx: SymbolIndex, etf: str | None) -> None:
    accepted = market_etfs(idx)
    if etf is not None and etf not in accepted:
        raise ApiError(
            "INVALID_PARAMETER",
            f"market_factor_etf={etf} is not served: this snapshot decomposes on "
            f"{', '.join(accepted) or 'no market ETF'} only; leave it out or give "
            f"{' or '.join(accepted)}",
            parameter="market_factor_etf",
            accepted=accepted,
        )


def _synonym(value: date | None, other: date | None, name: str, alias: str) -> date | None:
    """`from`/`start` (or `to`/`end`): one of the two, or both equal."""
    if value is not None and other is not None and value != other:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{name}={value} and {alias}={other} disagree; give one of the two",
            parameters=[name, alias],
        )
    return value if value is not None else other


def plan_l3(snap: Snapshot, p: L3Params) -> SeriesPlan:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    check_market_etf(idx, p.market_factor_etf)
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    first, last = _synonym(p.from_, p.start, "from", "start"), _synonym(p.to, p.end, "to", "end")
    if p.years is not None and first is not None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"years={p.years} and from={first} both set the start; give one of the two",
            parameters=["years", "from"],
        )
    end = last or idx.data_as_of
    back = p.years or 1
    start = first or date.fromordinal(minus_years(idx.data_as_of, back).toordinal() + 1)
    if start > end:
        raise ApiError(
            "INVALID_PARAMETER",
            f"from={start} is after to={end}"
            + ("" if last else " (to defaults to data_as_of)")
            + "; give from <= to",
            parameters=["from", "to"],
        )
    lo, hi = idx.date_range(start, end)
    return require_rows(snap, series_plan(snap, sym, lo, hi, start, end))


def size(plan: SeriesPlan, p: L3Params) -> Size:
    return series_size(plan, len(L3_COLUMNS), p.format)


def render(call: Call[L3Params, SeriesPlan]) -> Response:
    p, plan, snap = call.params, call.plan, call.snap
    return series_answer(
        call.request,
        snap,
        call.fmt,
        plan,
        L3_COLUMNS,
        canonical={"ticker": plan.symbol.ticker, "from": plan.start, "to": plan.end},
        years=p.years,
        filename=f"{plan.symbol.ticker}_l3-decomposition_{plan.start}_{plan.end}",
        csv_comment=p.csv_comment,
        extra=lambda: wire.l3_columns(snap, plan),
    )


ENDPOINT = Endpoint(
    path="/api/l3-decomposition",
    service="risk",
    price_key="l3-decomposition",
    params=L3Params,
    plan=plan_l3,
    size=size,
    tickers=series_ticker,
    formats=FORMATS,
    render=render,
    doc=Doc(
        name="l3_decomposition",
        summary="History of the L3 hedge ratios and risk shares",
        description=(
            "The sessions from `from` (or the last `years` years) to `to`, inclusive, where the "
            "symbol has a price. JSON: the real Service B's column layout `{dates, "
            "l3_market_hr, l3_sector_hr, l3_subsector_hr, l3_market_er, l3_sector_er, "
            "l3_subsector_er, l3_residual_er}` beside the rows `data` in short names; CSV or "
            "Parquet: the rows. `market_factor_etf` may only name the snapshot's market ETF. "
            "ETag / If-None-Match."
        ),
        response_model=L3Response,
        responses=SERIES_RESPONSES,
    ),
)
