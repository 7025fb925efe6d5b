"""`POST /api/decompose`: the real Service B's four-bets decomposition of one stock, a re-shape
of `/api/metrics`' latest L3 fields (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Any

from pydantic import Field
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import BODY_ERRORS, JSON_RESPONSES
from eqrisk.api.params import BodyParams, Ticker, VersionedParams
from eqrisk.api.plans import lookup, no_prices
from eqrisk.api.sizes import Size
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot

# Layer -> (its ER field, its HR field) at L3.
LAYERS: dict[str, tuple[str, str | None]] = {
    "market": ("l3_mkt_er", "l3_mkt_hr"),
    "sector": ("l3_sec_er", "l3_sec_hr"),
    "subsector": ("l3_sub_er", "l3_sub_hr"),
    "residual": ("l3_res_er", None),
}


class DecomposeParams(BodyParams, VersionedParams):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


def plan_decompose(snap: Snapshot, p: DecomposeParams) -> Symbol:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    if sym.last < 0:
        raise no_prices(idx, sym, idx.first_session, idx.data_as_of)
    return sym


def size(sym: Symbol, p: DecomposeParams) -> Size:
    return Size(1, 4, 900)


def decomposition(snap: Snapshot, sym: Symbol) -> dict[str, Any]:
    """The vendor's `{ticker, symbol, data_as_of, teo, exposure, hedge, _data_health}` from
    the symbol's latest values: `exposure` per layer `{er, hr, hedge_etf}` (the subsector
    falls back to the sector ETF, as the vendor's does), `hedge` the negated HR per ETF."""
    values = wire.latest_values(snap, sym)
    etfs = {
        "market": sym.market_etf or "SPY",
        "sector": sym.sector_etf,
        "subsector": sym.subsector_etf or sym.sector_etf,
        "residual": None,
    }
    exposure: dict[str, dict[str, Any]] = {}
    hedge: dict[str, float] = {}
    for layer, (er, hr) in LAYERS.items():
        ratio = values[hr] if hr is not None else None
        etf = etfs[layer]
        exposure[layer] = {"er": values[er], "hr": ratio, "hedge_etf": etf}
        if etf is not None and ratio is not None:
            hedge[etf] = hedge.get(etf, 0.0) - ratio
    ers = [exposure[layer]["er"] for layer in LAYERS]
    known = [e for e in ers if e is not None]
    teo = snap.sessions[sym.last].astype(object)
    return {
        "ticker": sym.ticker,
        "symbol": sym.ticker,
        "data_as_of": snap.index.data_as_of,
        "teo": teo,
        "exposure": exposure,
        "hedge": hedge,
        "_data_health": {
            "er_populated": bool(known),
            "er_sum": sum(known) if known else None,
        },
    }


def render(call: Call[DecomposeParams, Symbol]) -> Response:
    return document(call.snap, decomposition(call.snap, call.plan))


ENDPOINT = Endpoint(
    path="/api/decompose",
    method="POST",
    service="risk",
    price_key="decompose",
    params=DecomposeParams,
    plan=plan_decompose,
    size=size,
    tickers=lambda sym: (sym.ticker,),
    render=render,
    doc=Doc(
        name="decompose",
        summary="Four-bets decomposition of one stock (the real Service B's shape)",
        description=(
            "The latest L3 explained-risk shares and hedge ratios of `ticker` as four layers "
            "(`exposure.market`, `.sector`, `.subsector`, `.residual`, each `{er, hr, "
            "hedge_etf}`; the subsector layer names the sector ETF when the stock has no "
            "subsector ETF), `hedge` = dollars of each ETF to hold per $1 of stock (the negated "
            "hedge ratio, summed per ETF), and `_data_health.er_sum`. The same numbers as "
            "/api/metrics' l3 fields."
        ),
        responses={**JSON_RESPONSES, **BODY_ERRORS},
    ),
)
