"""`GET /api/tickers`: list or search the served symbols (free)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import ERRORS_NO_TICKER, SearchResults, TickerList
from eqrisk.api.params import VersionedParams
from eqrisk.api.sizes import Size
from eqrisk.data.master import MAG7
from eqrisk.snapshot.versions import Snapshot

SEARCH_LIMIT = 10


class TickersParams(VersionedParams):
    array: Literal["ticker"] | None = Field(
        None, description="`ticker`: list every ticker symbol (also the default)."
    )
    mag7: bool = Field(
        False, description="true: only the seven large caps AAPL MSFT GOOGL AMZN NVDA META TSLA."
    )
    search: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            f"Match on symbol or company name; up to {SEARCH_LIMIT} results, exact symbol first, "
            "then symbol prefixes, then names (word prefix, then substring)."
        ),
    )
    asset_type: Literal["stock", "etf", "index"] | None = Field(
        None, description="Only symbols of this asset type."
    )
    include_metadata: bool = Field(
        False,
        description=(
            "true: `tickers` holds objects `{ticker, company_name, sector, industry, asset_type, "
            "market_etf, sector_etf, subsector_etf}` instead of symbols."
        ),
    )


def plan_tickers(snap: Snapshot, p: TickersParams) -> dict[str, Any]:
    """`{tickers: [...]}` or, with `search`, `{query, results: [...]}`."""
    idx = snap.index
    keep = np.ones(len(idx.tickers), dtype=bool)
    if p.asset_type is not None:
        keep &= idx.type_array == p.asset_type
    if p.mag7:
        keep &= np.isin(idx.ticker_array, MAG7)
    if p.search is None:
        chosen = idx.ticker_array[keep].tolist()
        if p.mag7:
            chosen = [t for t in MAG7 if t in set(chosen)]
        rows: list[Any] = chosen
        if p.include_metadata:
            rows = [{"ticker": t, **idx.symbols[t].meta()} for t in chosen]
        return {"tickers": rows, "count": len(chosen)}
    query = p.search.strip()
    if not query:
        raise ApiError("INVALID_PARAMETER", "search must not be blank", parameter="search")
    upper, lower = query.upper(), query.lower()
    names = idx.name_array
    exact = idx.ticker_array == upper
    prefix = np.strings.startswith(idx.ticker_array, upper)
    word = np.strings.startswith(names, lower) | (np.strings.find(names, " " + lower) >= 0)
    inside = np.strings.find(names, lower) >= 0
    tier = np.select([exact, prefix, word, inside], [0, 1, 2, 3], default=9)
    pos = np.flatnonzero(keep & (tier < 9))
    cap = np.nan_to_num(idx.latest_cap[pos], nan=-1.0)
    pos = pos[np.lexsort((idx.ticker_array[pos], -cap, tier[pos]))][:SEARCH_LIMIT]
    results = []
    for i in pos.tolist():
        sym = idx.symbols[idx.tickers[i]]
        hit = {
            "ticker": sym.ticker,
            "company_name": sym.company_name,
            "sector": sym.sector,
            "asset_type": sym.asset_type,
        }
        results.append({"ticker": sym.ticker, **sym.meta()} if p.include_metadata else hit)
    # `tickers` is where the real Service B's readers look for rows; `results` stays for ours.
    return {"query": query, "results": results, "tickers": results, "count": len(results)}


def size(doc: dict[str, Any], p: TickersParams) -> Size:
    rows = doc["count"]
    per = 200 if p.include_metadata else 80 if "results" in doc else 8
    return Size(1, rows, 300 + rows * per)


def render(call: Call[TickersParams, dict[str, Any]]) -> Response:
    return document(call.snap, call.plan)


ENDPOINT = Endpoint(
    path="/api/tickers",
    service="risk",
    price_key="tickers",
    params=TickersParams,
    plan=plan_tickers,
    size=size,
    render=render,
    doc=Doc(
        name="tickers",
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
    ),
)
