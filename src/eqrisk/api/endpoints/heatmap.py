"""`GET /api/heatmap`: the largest stocks with their latest return, for a treemap."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Any

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import rows_of
from eqrisk.api.models import ERRORS, HeatmapResponse
from eqrisk.api.params import VersionedParams
from eqrisk.api.plans import NO_CAPS_HINT
from eqrisk.api.sizes import Size
from eqrisk.data.master import MAG7
from eqrisk.snapshot.index import RECENT_SESSIONS
from eqrisk.snapshot.versions import Snapshot

HEATMAP_DEFAULT, HEATMAP_MAX = 50, 500


class HeatmapParams(VersionedParams):
    limit: int = Field(
        HEATMAP_DEFAULT,
        ge=1,
        le=HEATMAP_MAX,
        description=f"How many stocks, largest market cap first (1 to {HEATMAP_MAX}).",
    )


def plan_heatmap(snap: Snapshot, p: HeatmapParams) -> np.ndarray:
    """Positions (into the index's sorted tickers) of the rows, largest market cap first; no
    eligible stock is NO_DATA (404, free) with the reason, never an empty 200."""
    idx = snap.index
    if not len(idx.heatmap_order):
        if idx.stocks_with_cap == 0:
            detail = f"the data set has no market caps: {NO_CAPS_HINT}"
        else:
            detail = (
                f"no stock with a market cap was priced in the last {RECENT_SESSIONS} "
                f"sessions up to {idx.data_as_of}; ingest recent prices, then eqrisk build"
            )
        raise ApiError("NO_DATA", detail, missing="market_cap", data_as_of=idx.data_as_of)
    return idx.heatmap_order[: p.limit]


def size(pos: np.ndarray, p: HeatmapParams) -> Size:
    rows = len(pos)
    return Size(1, rows, 600 + rows * 220)


def render(call: Call[HeatmapParams, np.ndarray]) -> Response:
    snap, p, caller = call.snap, call.params, call.caller
    idx = snap.index
    pos = call.plan
    eligible = idx.heatmap_order
    if caller.is_demo:  # the demo key sees its seven tickers (gate.demo_rules), not the market
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
    return document(snap, {"data": rows_of(columns), "meta": meta})


ENDPOINT = Endpoint(
    path="/api/heatmap",
    service="risk",
    price_key="heatmap",
    params=HeatmapParams,
    plan=plan_heatmap,
    size=size,
    render=render,
    doc=Doc(
        name="heatmap",
        summary="Largest stocks with their latest return, for a treemap",
        description=(
            "The top `limit` stocks by market cap on their latest session (stocks priced in the "
            f"last {RECENT_SESSIONS} sessions and with a market cap), largest first. "
            "No such stock (for example a data set without market caps) is a 404 NO_DATA that "
            "says what is missing; it is not charged."
        ),
        response_model=HeatmapResponse,
        responses=ERRORS,
    ),
)
