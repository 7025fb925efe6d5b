"""`GET /gross` and `GET /resids`: the daily gross and residual returns of symbols (Service A;
the same parameters and checks, one array each)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from starlette.responses import Response

from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import GrossReturnRecord, ResidualRecord, daily_responses
from eqrisk.api.params import (
    DAILY_FORMATS,
    EndField,
    FormatField,
    StartField,
    SymbolsField,
    VersionedParams,
)
from eqrisk.api.service_a import SymbolRange, answer, range_tickers, symbol_range, symbol_series
from eqrisk.snapshot.versions import Snapshot


class SymbolsQuery(VersionedParams):
    symbols: SymbolsField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


def plan_symbols(snap: Snapshot, q: SymbolsQuery) -> SymbolRange:
    return symbol_range(snap, q.symbols, q.start_time, q.end_time)


def render_gross(call: Call[SymbolsQuery, SymbolRange]) -> Response:
    """P(t) / P(t-1) - 1 on the adjusted close, over consecutive priced sessions."""
    plan = call.plan
    u = plan.universe
    cols = symbol_series(
        call.snap, u, plan.tickers, "return", plan.lo, plan.hi, u.midnight, "gross_return"
    )
    return answer(call.request, call.fmt, u, cols, "gross")


def render_resids(call: Call[SymbolsQuery, SymbolRange]) -> Response:
    """residual_return(t) = gross_return(t) - b_Mkt(t-1) f_Mkt(t) - b_sec(t-1) f_sec(t), with
    the betas of the previous session (no look-ahead); the sector term only for stocks exposed
    to a sector."""
    plan = call.plan
    u = plan.universe
    cols = symbol_series(
        call.snap, u, plan.tickers, "resid_return", plan.lo, plan.hi, u.day, "residual_return"
    )
    return answer(call.request, call.fmt, u, cols, "resids")


GROSS = Endpoint(
    path="/gross",
    service="daily",
    price_key="gross",
    params=SymbolsQuery,
    plan=plan_symbols,
    tickers=range_tickers,
    formats=DAILY_FORMATS,
    render=render_gross,
    threaded=True,
    doc=Doc(
        name="gross",
        operation_id="gross",
        summary="Daily gross (simple) returns of symbols",
        response_model=list[GrossReturnRecord],
        responses=daily_responses(),
    ),
)

RESIDS = Endpoint(
    path="/resids",
    service="daily",
    price_key="resids",
    params=SymbolsQuery,
    plan=plan_symbols,
    tickers=range_tickers,
    formats=DAILY_FORMATS,
    render=render_resids,
    threaded=True,
    doc=Doc(
        name="resids",
        operation_id="resids",
        summary="Daily residual returns of symbols after the Mkt and sector factors",
        response_model=list[ResidualRecord],
        responses=daily_responses(),
    ),
)
