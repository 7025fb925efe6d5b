"""`GET /api/metrics/{ticker}`: the latest risk snapshot of one ticker."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Any

from pydantic import Field
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import JSON_RESPONSES, MetricsResponse
from eqrisk.api.params import Ticker, VersionedParams, path_and_query
from eqrisk.api.plans import lookup, no_prices
from eqrisk.api.sizes import Size
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot


class MetricsQuery(VersionedParams):
    """The query of /api/metrics/{ticker}: `version` only."""


class MetricsParams(VersionedParams):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


def plan_metrics(snap: Snapshot, p: MetricsParams) -> Symbol:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    if sym.last < 0:
        raise no_prices(idx, sym, idx.first_session, idx.data_as_of)
    return sym


def size(sym: Symbol, p: MetricsParams) -> Size:
    return Size(1, 1, 1500)


def metrics_doc(snap: Snapshot, sym: Symbol) -> dict[str, Any]:
    """The latest values of a priced symbol (the plan refuses one that was never priced), how
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


def render(call: Call[MetricsParams, Symbol]) -> Response:
    return document(call.snap, metrics_doc(call.snap, call.plan))


ENDPOINT = Endpoint(
    path="/api/metrics/{ticker}",
    service="risk",
    price_key="metrics",
    params=MetricsParams,
    reader=path_and_query(
        MetricsQuery,
        MetricsParams,
        description="Ticker symbol, case-insensitive.",
        examples=["NVDA", "SPY"],
    ),
    plan=plan_metrics,
    size=size,
    tickers=lambda sym: (sym.ticker,),
    render=render,
    replayed=True,  # a function of the version and the path alone (gate.Replays)
    doc=Doc(
        name="metrics",
        summary="Latest risk snapshot of one ticker",
        description=(
            "Volatility, price, market cap, the L1/L2/L3 hedge ratios, explained-risk shares and "
            "per-level betas on the symbol's latest priced session (`teo`), and the same values "
            "as `hedge_levels` (a block per level with its `hedge_etfs`). A hedge ratio is "
            "dollars of ETF per $1 of stock with the regression-coefficient sign: the market HR "
            "at L2/L3 is often negative. A symbol whose last price is older than the snapshot's "
            "`data_as_of` (delisted, halted) says so: `stale: true`, its `last_session` and "
            "`sessions_behind`."
        ),
        response_model=MetricsResponse,
        responses=JSON_RESPONSES,
    ),
)
