"""`GET /symbol_list`: stocks ranked on the latest session by market cap, price, return or
volume (Service A)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api import formats
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import TOP_BY
from eqrisk.api.models import SymbolList, daily_responses
from eqrisk.api.params import DAILY_FORMATS, VersionedParams
from eqrisk.api.plans import NO_CAPS_HINT
from eqrisk.api.service_a import answer, choice, headers, optional, sector_codes
from eqrisk.snapshot.index import SymbolIndex
from eqrisk.snapshot.versions import Snapshot

MAX_TOP_N = 500
DEFAULT_TOP_N = 10


class SymbolListQuery(VersionedParams):
    top_n: int = Field(
        DEFAULT_TOP_N, ge=1, le=MAX_TOP_N, description=f"How many symbols, 1 to {MAX_TOP_N}."
    )
    top_by: str = Field(
        "mktcap",
        description=(
            "Ranking value on the latest session: mktcap, mktcap_rank, close (adjusted), "
            "return (simple, that session), turnover, volume."
        ),
        json_schema_extra={"enum": list(TOP_BY)},
    )
    ascending: bool = Field(False, description="Smallest value first (default: largest first).")
    sector_code: str | None = Field(
        None,
        description=(
            "Only this GICS sector: 10 Energy, 15 Materials, 20 Industrials, 25 Consumer "
            "Discretionary, 30 Consumer Staples, 35 Health Care, 40 Financials, "
            "45 Information Technology, 50 Communication Services, 55 Utilities, "
            "60 Real Estate."
        ),
        examples=["45"],
    )
    format: str | None = Field(
        None,
        description=(
            "`json` (`{symbols: [...]}`, the default) or `csv` (a header row `symbol`, then one "
            "symbol per row, best first). Without it the Accept header decides."
        ),
        json_schema_extra={"enum": list(DAILY_FORMATS)},
    )


def _rankings_with_values(snap: Snapshot, universe: SymbolIndex, eligible: np.ndarray) -> list[str]:
    """The `top_by` values some eligible stock has on the latest session."""
    if not len(universe.day):
        return []
    return [
        key
        for key, array in TOP_BY.items()
        if np.isfinite(np.asarray(snap.array(array)[:, -1])[eligible]).any()
    ]


def no_ranking(
    snap: Snapshot,
    universe: SymbolIndex,
    key: str,
    sector: str | None,
    eligible: np.ndarray,
    defaulted: bool = False,
) -> ApiError:
    """NO_DATA for a ranking without any value on the latest session, saying what is missing
    (and, where `top_by` was left to its default, that the default is the market cap and
    which rankings the data set does have)."""
    as_of = universe.data_as_of_text
    caps = np.asarray(snap.array("market_cap")[:, -1]) if len(universe.day) else np.empty(0)
    available = _rankings_with_values(snap, universe, eligible)
    if key in ("mktcap", "mktcap_rank") and not np.isfinite(caps[universe.by_row.is_stock]).any():
        detail = f"the data set has no market caps on its latest session {as_of}: {NO_CAPS_HINT}"
        if defaulted:
            detail = f"top_by defaults to mktcap, and {detail}"
        if available:
            detail += "; or rank by a value it has: " + ", ".join(f"top_by={k}" for k in available)
    else:
        where = f"stock of sector {sector}" if sector is not None else "stock"
        need = {
            "volume": "a price file with a volume column",
            "turnover": "a price file with volume and a raw close",
        }.get(key, "prices on the latest session")
        detail = f"no {where} has a {key} value on the latest session {as_of}; ingest {need}"
    return ApiError(
        "NO_DATA",
        detail,
        parameter="top_by",
        top_by=key,
        data_as_of=as_of,
        stocks=int(eligible.sum()),
        rankings_available=available,
    )


def plan_symbol_list(snap: Snapshot, q: SymbolListQuery) -> list[str]:
    """The ranked symbols (the checks in order: top_by, sector_code, then data)."""
    universe = snap.index
    defaulted = "top_by" not in q.model_fields_set
    key = choice("top_by", optional(q.top_by) or "mktcap", list(TOP_BY))
    eligible = universe.by_row.is_stock.copy()
    code = optional(q.sector_code)
    if code is not None:
        codes = sector_codes()
        code = code.strip()
        if code not in codes:
            raise ApiError(
                "INVALID_PARAMETER",
                f"sector_code {q.sector_code!r} is not a GICS sector code; accepted: "
                + ", ".join(f"{c} ({name})" for c, name in codes.items()),
                parameter="sector_code",
                accepted=list(codes),
            )
        eligible &= universe.by_row.sector_code == code
    if not len(universe.day):
        raise no_ranking(snap, universe, key, code, eligible, defaulted)
    values = np.asarray(snap.array(TOP_BY[key])[:, -1])
    rows = np.flatnonzero(eligible & np.isfinite(values))
    if not len(rows):
        raise no_ranking(snap, universe, key, code, eligible, defaulted)
    ranked = values[rows] if q.ascending else -values[rows]
    # lexsort: the last key is primary; tickers break ties (ascending).
    order = np.lexsort((universe.by_row.tickers[rows].astype(str), ranked))
    symbols: list[str] = universe.by_row.tickers[rows[order[: q.top_n]]].tolist()
    return symbols


def render(call: Call[SymbolListQuery, list[str]]) -> Response:
    """Stocks (not ETFs) ordered by `top_by` on the snapshot's latest session (`X-Data-As-Of`),
    descending unless `ascending`; ties by symbol. Stocks without a value that session (no
    price, delisted) are left out; when none has one (for example a data set without market
    caps) the answer is a 404 NO_DATA that says what is missing and which `top_by` values the
    data set has (`rankings_available`); without `top_by` it says the default is mktcap. The order is by the value
    itself, so `mktcap_rank` with `ascending=false` lists the largest rank numbers (smallest
    companies) first. JSON `{symbols}` or CSV (header `symbol`, one row per symbol)."""
    universe = call.snap.index
    if call.fmt == formats.CSV:
        columns = {"symbol": np.array(call.plan, dtype=object)}
        return answer(call.request, call.fmt, universe, columns, "symbol_list")
    return formats.json_response({"symbols": call.plan}, headers=headers(universe))


ENDPOINT = Endpoint(
    path="/symbol_list",
    service="daily",
    price_key="symbol_list",
    params=SymbolListQuery,
    plan=plan_symbol_list,
    formats=DAILY_FORMATS,
    render=render,
    threaded=True,
    doc=Doc(
        name="symbol_list",
        operation_id="symbol_list",
        summary="Stocks ranked on the latest session by market cap, price, return or volume",
        response_model=SymbolList,
        responses=daily_responses(),
    ),
)
