"""`GET /daily`: daily prices, volume, returns, market cap and sector per symbol (Service A)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.fields import DAILY_FIELDS
from eqrisk.api.models import DailyRecord, daily_responses
from eqrisk.api.params import (
    DAILY_FORMATS,
    EndField,
    FormatField,
    StartField,
    SymbolsField,
    VersionedParams,
)
from eqrisk.api.service_a import (
    SymbolRange,
    answer,
    concat,
    parse_fields,
    parse_symbols,
    range_tickers,
    require_prices,
    session_range,
    where_published,
)
from eqrisk.snapshot.versions import Snapshot


class DailyQuery(VersionedParams):
    symbols: SymbolsField
    start_time: StartField
    end_time: EndField = None
    fields: str | None = Field(
        None,
        description=(
            "Comma-separated fields besides `symbol` and `teo` (always present), in the order "
            f"wanted; default: all. Valid: {', '.join(DAILY_FIELDS)}. `close` is the adjusted "
            "close; `close_raw`, `open`, `high`, `low` and `volume` are as traded; `mktcap` in "
            "USD; `turnover` = close as traded x volume."
        ),
        examples=["close,volume"],
    )
    format: FormatField = None


@dataclass(frozen=True)
class DailyPlan(SymbolRange):
    fields: list[str]


def plan_daily(snap: Snapshot, q: DailyQuery) -> DailyPlan:
    """Symbols, then fields, then the range, then data (the order the checks are made in)."""
    universe = snap.index
    tickers = parse_symbols(q.symbols, universe)
    wanted = parse_fields(q.fields)
    lo, hi = session_range(snap, universe, q.start_time, q.end_time)
    require_prices(snap, universe, tickers, lo, hi)
    return DailyPlan(universe, tickers, lo, hi, wanted)


def render(call: Call[DailyQuery, DailyPlan]) -> Response:
    """One record per symbol and session on which the symbol has a price, symbols in the order
    asked, sessions ascending."""
    snap, plan = call.snap, call.plan
    universe, tickers, lo, hi = plan.universe, plan.tickers, plan.lo, plan.hi
    rows = [universe.row_of[s] for s in tickers]
    where, _ = where_published(snap.array("price_close"), rows, lo, hi)
    counts = [len(w) for w in where]
    columns: dict[str, np.ndarray] = {
        "symbol": np.repeat(np.array(tickers, dtype=object), counts),
        "teo": universe.day[concat(where, np.int64)],
    }
    for name in plan.fields:
        source = DAILY_FIELDS[name]
        if source is None:
            per_row = (
                universe.by_row.sector_code
                if name == "sector_code"
                else universe.by_row.sector_name
            )
            columns[name] = np.repeat(per_row[rows], counts)
        else:
            values = snap.array(source)
            columns[name] = concat([values[r, w] for r, w in zip(rows, where, strict=True)])
    return answer(call.request, call.fmt, universe, columns, "daily")


ENDPOINT = Endpoint(
    path="/daily",
    service="daily",
    price_key="daily",
    params=DailyQuery,
    plan=plan_daily,
    tickers=range_tickers,
    formats=DAILY_FORMATS,
    render=render,
    threaded=True,
    doc=Doc(
        name="daily",
        operation_id="daily",
        summary="Daily prices, volume, returns, market cap and sector per symbol",
        response_model=list[DailyRecord],  # type: ignore[valid-type]
        responses=daily_responses(),
    ),
)
