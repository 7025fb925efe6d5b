"""`GET /api/batch/latest-metrics`: the latest L3 hedge ratios and shares of many tickers in one
call, in the real Service B's shape (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

import re
from typing import Any

from pydantic import Field
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import JSON_RESPONSES
from eqrisk.api.params import VersionedParams
from eqrisk.api.plans import resolve, ticker_not_found
from eqrisk.api.sizes import Size
from eqrisk.snapshot.index import Symbol
from eqrisk.snapshot.versions import Snapshot

MAX_LATEST_TICKERS = 100
LATEST_FIELDS = ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr", "l3_mkt_er", "l3_sec_er", "l3_sub_er")
_SPLIT = re.compile(r"[\s,]+")


def ticker_list(text: str, limit: int = MAX_LATEST_TICKERS) -> list[str]:
    """Comma- or space-separated tickers, upper-cased, de-duplicated, the first `limit` kept."""
    names = [t.upper() for t in _SPLIT.split(text.strip()) if t]
    return list(dict.fromkeys(names))[:limit]


class LatestMetricsParams(VersionedParams):
    tickers: str = Field(
        min_length=1,
        max_length=4000,
        description=(
            f"Comma- or space-separated tickers, case-insensitive; duplicates merged, the first "
            f"{MAX_LATEST_TICKERS} kept. Unknown tickers are left out of `data` and named in "
            "`unknown`; none known is a 404."
        ),
        examples=["AAPL,MSFT,NVDA"],
    )

    def names(self) -> list[str]:
        return ticker_list(self.tickers)


def plan_latest(snap: Snapshot, p: LatestMetricsParams) -> tuple[list[Symbol], list[str]]:
    """The known symbols in request order (a share-class twin as served) and the unknown
    names; none known is a 404 naming them."""
    names = p.names()
    if not names:
        raise ApiError(
            "MISSING_PARAMETER",
            "tickers is empty; give comma-separated tickers (e.g. tickers=AAPL,MSFT)",
            parameter="tickers",
        )
    found: dict[str, Symbol] = {}
    unknown: list[str] = []
    for name in names:
        sym = resolve(snap.index, name)
        if sym is None:
            unknown.append(name)
        else:
            found.setdefault(sym.ticker, sym)
    if not found:
        raise ticker_not_found(snap.index, unknown, parameter="tickers")
    return list(found.values()), unknown


def size(plan: tuple[list[Symbol], list[str]], p: LatestMetricsParams) -> Size:
    rows = len(plan[0])
    return Size(1, rows, 400 + 260 * rows)


def latest_row(snap: Snapshot, sym: Symbol) -> dict[str, Any]:
    """`{ticker, date, l3_*}`: the symbol's latest values (all null when never priced)."""
    if sym.last < 0:
        return {"ticker": sym.ticker, "date": None, **dict.fromkeys(LATEST_FIELDS)}
    values = wire.latest_values(snap, sym)
    row: dict[str, Any] = {"ticker": sym.ticker, "date": snap.sessions[sym.last].astype(object)}
    row.update({name: values[name] for name in LATEST_FIELDS})
    return row


def render(call: Call[LatestMetricsParams, tuple[list[Symbol], list[str]]]) -> Response:
    syms, unknown = call.plan
    rows = [latest_row(call.snap, sym) for sym in syms]
    return document(call.snap, {"data": rows, "source": "snapshot_latest", "unknown": unknown})


ENDPOINT = Endpoint(
    path="/api/batch/latest-metrics",
    service="risk",
    price_key="batch/latest-metrics",
    params=LatestMetricsParams,
    plan=plan_latest,
    size=size,
    asked=lambda p: p.names(),
    tickers=lambda plan: tuple(s.ticker for s in plan[0]),
    render=render,
    doc=Doc(
        name="batch_latest_metrics",
        summary="Latest L3 hedge ratios and shares of many tickers (the real Service B's shape)",
        description=(
            "One row per known ticker, in request order: `{ticker, date, l3_mkt_hr, l3_sec_hr, "
            "l3_sub_hr, l3_mkt_er, l3_sec_er, l3_sub_er}` on its latest priced session (`date`), "
            "the values of /api/metrics. Unknown tickers are left out (listed in `unknown`); "
            "none known is a 404. One price per call."
        ),
        responses=JSON_RESPONSES,
    ),
)
