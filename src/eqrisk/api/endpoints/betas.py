"""`GET /betas`: factor betas of symbols (Mkt, or the symbol's own sector) (Service A)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass

import numpy as np
from starlette.responses import Response

from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import BetaRecord, daily_responses
from eqrisk.api.params import (
    DAILY_FORMATS,
    EndField,
    FactField,
    FormatField,
    StartField,
    SymbolsField,
    VersionedParams,
)
from eqrisk.api.service_a import (
    SymbolRange,
    answer,
    parse_factor,
    parse_symbols,
    range_tickers,
    require_prices,
    session_range,
    symbol_series,
)
from eqrisk.snapshot.versions import Snapshot


class BetasQuery(VersionedParams):
    symbols: SymbolsField
    fact: FactField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


@dataclass(frozen=True)
class BetasPlan(SymbolRange):
    factor: int


def plan_betas(snap: Snapshot, q: BetasQuery) -> BetasPlan:
    """Symbols, then the factor, then the range, then data."""
    universe = snap.index
    tickers = parse_symbols(q.symbols, universe)
    k = parse_factor(q.fact, universe)
    lo, hi = session_range(snap, universe, q.start_time, q.end_time)
    require_prices(snap, universe, tickers, lo, hi)
    return BetasPlan(universe, tickers, lo, hi, k)


def render(call: Call[BetasQuery, BetasPlan]) -> Response:
    """The beta of each symbol to one factor, estimated with data up to and including `teo`
    (the residual of the next session uses it). Every symbol is exposed to `Mkt`; a sector
    factor only for the stocks of that sector: other symbols give no rows."""
    snap, plan = call.snap, call.plan
    universe, tickers, k = plan.universe, plan.tickers, plan.factor
    if universe.factor_names[k] == universe.market_factor:
        exposed, field = tickers, "beta_mkt"
    else:
        exposed = [s for s in tickers if universe.by_row.exposure[universe.row_of[s]] == k]
        field = "beta_sec"
    cols = symbol_series(
        snap, universe, exposed, field, plan.lo, plan.hi, universe.day, "factor_beta"
    )
    cols["fact"] = np.full(len(cols["teo"]), universe.factor_names[k], dtype=object)
    return answer(call.request, call.fmt, universe, cols, "betas")


ENDPOINT = Endpoint(
    path="/betas",
    service="daily",
    price_key="betas",
    params=BetasQuery,
    plan=plan_betas,
    tickers=range_tickers,
    formats=DAILY_FORMATS,
    render=render,
    threaded=True,
    doc=Doc(
        name="betas",
        operation_id="betas",
        summary="Factor betas of symbols (Mkt, or the symbol's own sector)",
        response_model=list[BetaRecord],
        responses=daily_responses(),
    ),
)
