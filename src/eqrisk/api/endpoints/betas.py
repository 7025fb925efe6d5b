"""`GET /betas`: factor betas of symbols (Mkt, the symbol's own sector, or a style factor's
loading: its style exposure) (Service A)."""

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
    concat,
    parse_factor,
    parse_symbols,
    range_tickers,
    require_prices,
    session_range,
    symbol_series,
)
from eqrisk.snapshot.style_series import in_layer, style_loadings, style_names
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
    k = parse_factor(q.fact, universe, style_names(snap.manifest))
    lo, hi = session_range(snap, universe, q.start_time, q.end_time)
    require_prices(snap, universe, tickers, lo, hi)
    return BetasPlan(universe, tickers, lo, hi, k)


def _style_series(snap: Snapshot, plan: BetasPlan, j: int) -> dict[str, np.ndarray]:
    """Records {teo, symbol, factor_beta} of style factor j: each symbol's exposure known at
    the close of `teo` (the one /api/style-exposures gives for the next session), where the
    symbol is in the layer."""
    universe = plan.universe
    rows = [universe.row_of[s] for s in plan.tickers]
    loadings = style_loadings(snap, rows, plan.lo, plan.hi)
    where = [np.flatnonzero(in_layer(x)) for x in loadings]
    return {
        "teo": universe.day[concat([w + plan.lo for w in where], np.int64)],
        "symbol": np.repeat(np.array(plan.tickers, dtype=object), [len(w) for w in where]),
        "factor_beta": concat([x[w, j] for x, w in zip(loadings, where, strict=True)]),
    }


def render(call: Call[BetasQuery, BetasPlan]) -> Response:
    """The beta of each symbol to one factor, estimated with data up to and including `teo`
    (the residual of the next session uses it). Every symbol is exposed to `Mkt`; a sector
    factor only for the stocks of that sector; a style factor only for the stocks in the
    second layer (its loading is the stock's style exposure): other symbols give no rows."""
    snap, plan = call.snap, call.plan
    universe, tickers, k = plan.universe, plan.tickers, plan.factor
    names = universe.factor_names
    if k >= len(names):
        j = k - len(names)
        cols = _style_series(snap, plan, j)
        name = style_names(snap.manifest)[j]
    else:
        if names[k] == universe.market_factor:
            exposed, field = tickers, "beta_mkt"
        else:
            exposed = [s for s in tickers if universe.by_row.exposure[universe.row_of[s]] == k]
            field = "beta_sec"
        cols = symbol_series(
            snap, universe, exposed, field, plan.lo, plan.hi, universe.day, "factor_beta"
        )
        name = names[k]
    cols["fact"] = np.full(len(cols["teo"]), name, dtype=object)
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
        summary="Factor betas of symbols (Mkt, the symbol's own sector, the style factors)",
        response_model=list[BetaRecord],
        responses=daily_responses(),
    ),
)
