"""Service A: daily stock data over the current snapshot (paths at the root, key in `apikey`).

`/daily`, `/betas`, `/facts`, `/gross`, `/resids` and `/symbol_list`. Every answer is a slice of
the snapshot's (symbols x sessions) arrays: no regression is computed here and no pandas runs on
the request path. JSON answers are bare arrays of records (no envelope); CSV answers carry the
same columns and formats after a header row. Every answer carries `X-Model-Version` and
`X-Data-As-Of`.

Decisions where the spec says "not shown" (DESIGN section 3):
- `symbols`: comma-separated, case-insensitive, trimmed; empty items are ignored and duplicates
  dropped (first kept, order preserved). 1 to `MAX_SYMBOLS` (100) per call. Any unknown symbol
  is a 404 TICKER_NOT_FOUND naming every unknown one (`unknown` in the body).
- `start_time` (required) and `end_time` (optional, default: the latest session) are inclusive
  `YYYY-MM-DD` dates; a malformed date or a start after the end (given or default) is a 400. A
  valid range without sessions (e.g. before the data begins) answers an empty array.
- An optional parameter given empty (`end_time=`, `fields=`, `format=`, `sector_code=`) is the
  same as absent; a required one given empty is a 400 MISSING_PARAMETER. `format` is checked
  before anything else, then symbols, then the other parameters.
- Rows come per symbol in the order asked, sessions ascending, and only where the value exists:
  `/daily` where the symbol has a price that session; `/betas`, `/gross`, `/resids`, `/facts`
  where the value is published (no beta before the model's minimum observations, no return on a
  symbol's first priced session, no residual without the previous session's betas). Inside a
  `/daily` row a field the data lacks (for example `close_raw` or `mktcap` where the source has
  no raw close or shares) is JSON null / an empty CSV cell.
- `/betas`: every symbol is exposed to `Mkt`; a sector factor only for the stocks of that sector.
  A symbol without the exposure contributes no rows. The beta at `teo` t uses data up to and
  including t; the residual of t+1 uses it.
- `/symbol_list`: stocks only (no ETFs), on the latest session of the snapshot; symbols without
  a value that session are left out; ordered by the value (descending unless `ascending`), ties
  by symbol ascending; `top_n` 1 to `MAX_TOP_N` (500), default 10.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from eqrisk.api import formats
from eqrisk.api.deps import SnapshotDep, daily_caller
from eqrisk.api.errors import ApiError, problem_responses
from eqrisk.data.master import sector_table
from eqrisk.model.risk import MARKET_FACTOR
from eqrisk.snapshot.store import Snapshot

MAX_SYMBOLS = 100
MAX_TOP_N = 500
DEFAULT_TOP_N = 10
FORMATS = (formats.JSON, formats.CSV)

# /daily field -> snapshot array (None: a per-symbol attribute from the symbols table).
DAILY_FIELDS: dict[str, str | None] = {
    "open": "open",
    "high": "high",
    "low": "low",
    "close": "price_close",
    "close_raw": "close_raw",
    "volume": "volume",
    "return": "return",
    "log_return": "log_return",
    "mktcap": "market_cap",
    "mktcap_rank": "mktcap_rank",
    "turnover": "turnover",
    "sector_code": None,
    "sector": None,
}
ALWAYS = ("symbol", "teo")

# /symbol_list top_by -> snapshot array.
TOP_BY: dict[str, str] = {
    "mktcap": "market_cap",
    "mktcap_rank": "mktcap_rank",
    "close": "price_close",
    "return": "return",
    "turnover": "turnover",
    "volume": "volume",
}

_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


# --------------------------------------------------------------------------------------------
# Records (documentation of the answers; the rows themselves are rendered by `formats`)


class DailyRecord(BaseModel):
    """One symbol on one session. `symbol` and `teo` always; the rest as asked in `fields`."""

    model_config = ConfigDict(populate_by_name=True)

    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    teo: str = Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])
    open: float | None = Field(None, description="Opening price as traded (unadjusted).")
    high: float | None = Field(None, description="High price as traded (unadjusted).")
    low: float | None = Field(None, description="Low price as traded (unadjusted).")
    close: float | None = Field(None, description="Split- and dividend-adjusted close.")
    close_raw: float | None = Field(None, description="Close as traded (unadjusted).")
    volume: float | None = Field(None, description="Shares traded (as traded).")
    return_: float | None = Field(
        None, alias="return", description="Simple daily return of the adjusted close (decimal)."
    )
    log_return: float | None = Field(None, description="ln(1 + return).")
    mktcap: float | None = Field(None, description="Market capitalisation, USD.")
    mktcap_rank: float | None = Field(
        None, description="Rank by market cap among the stocks that session (1 = largest)."
    )
    turnover: float | None = Field(None, description="Traded value: close as traded x volume.")
    sector_code: str | None = Field(None, description="GICS 2-digit sector code.")
    sector: str | None = Field(None, description="GICS sector name.")


class BetaRecord(BaseModel):
    teo: str = Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    factor_beta: float = Field(description="Exposure to the factor, estimated up to teo.")
    fact: str = Field(description="Factor name.", examples=["Mkt"])


class FactorReturnRecord(BaseModel):
    teo: str = Field(description="Session, YYYY-MM-DDT00:00:00.", examples=["2024-03-28T00:00:00"])
    fact: str = Field(description="Factor name.", examples=["Mkt"])
    factor_return: float = Field(description="Factor return of the session (decimal).")


class GrossReturnRecord(BaseModel):
    teo: str = Field(description="Session, YYYY-MM-DDT00:00:00.", examples=["2024-03-28T00:00:00"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    gross_return: float = Field(description="Simple daily return (decimal).")


class ResidualRecord(BaseModel):
    teo: str = Field(description="Session date, YYYY-MM-DD.", examples=["2024-03-28"])
    symbol: str = Field(description="Ticker.", examples=["AAPL"])
    residual_return: float = Field(
        description="gross_return - b_Mkt(t-1) f_Mkt(t) - b_sec(t-1) f_sec(t) (decimal)."
    )


class SymbolList(BaseModel):
    symbols: list[str] = Field(description="Tickers, best first.", examples=[["AAPL", "MSFT"]])


_ERRORS = problem_responses(400, 401, "4XX", 500, 503)  # "4XX" replaces FastAPI's 422
_NOT_FOUND = problem_responses(404)
_CSV = {"text/csv": {"schema": {"type": "string", "description": "Header row, then the rows."}}}


def _responses(not_found: bool = True) -> dict[int | str, Any]:
    out: dict[int | str, Any] = {
        200: {"content": {formats.MEDIA_TYPES[formats.JSON]: {}, **_CSV}},
        **_ERRORS,
    }
    if not_found:
        out.update(_NOT_FOUND)
    return out


# --------------------------------------------------------------------------------------------
# Per-snapshot lookups, built once per version


@dataclass(frozen=True)
class _Universe:
    """What the routes need besides the arrays, indexed by array row."""

    version: str
    data_as_of: str
    row_of: dict[str, int]
    tickers: np.ndarray  # (n,) object
    is_stock: np.ndarray  # (n,) bool
    sector_code: np.ndarray  # (n,) object: str | None
    sector_name: np.ndarray  # (n,) object: str | None
    exposure: np.ndarray  # (n,) int: index of the sector factor, -1 = Mkt only
    factor_names: list[str]
    factor_of: dict[str, int]  # normalised factor name -> index
    day: np.ndarray  # (T,) "YYYY-MM-DD"
    midnight: np.ndarray  # (T,) "YYYY-MM-DDT00:00:00"


_UNIVERSES: dict[str, _Universe] = {}
_UNIVERSES_LOCK = threading.Lock()
_UNIVERSES_KEPT = 4


def _norm_factor(name: str) -> str:
    """'information technology' == 'Information_Technology' == 'INFORMATION  TECHNOLOGY'."""
    return re.sub(r"[\s_]+", "_", name.strip()).casefold()


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _build_universe(snap: Snapshot) -> _Universe:
    table = snap.symbols
    n = len(table)
    rows = table["row"].to_numpy(dtype=np.int64)
    tickers = np.empty(n, dtype=object)
    tickers[rows] = table["ticker"].to_numpy(dtype=object)
    is_stock = np.zeros(n, dtype=bool)
    is_stock[rows] = (table["asset_type"] == "stock").to_numpy()
    sector_code = np.empty(n, dtype=object)
    sector_code[rows] = [_text_or_none(v) for v in table["sector_code"]]
    sector_name = np.empty(n, dtype=object)
    sector_name[rows] = [_text_or_none(v) for v in table["gics_sector"]]
    names = snap.factor_names
    position = {name: k for k, name in enumerate(names)}
    exposure = np.full(n, -1, dtype=np.int64)
    exposure[rows] = [position.get(_text_or_none(v) or "", -1) for v in table["sector_factor"]]
    exposure[exposure == position.get(MARKET_FACTOR, -2)] = -1
    sessions = snap.sessions.astype("datetime64[D]")
    day = np.datetime_as_string(sessions, unit="D").astype(object)
    return _Universe(
        version=snap.version,
        data_as_of=str(snap.manifest.get("data_as_of") or (day[-1] if len(day) else "")),
        row_of={str(t): int(r) for t, r in zip(tickers, range(n), strict=True)},
        tickers=tickers,
        is_stock=is_stock,
        sector_code=sector_code,
        sector_name=sector_name,
        exposure=exposure,
        factor_names=names,
        factor_of={_norm_factor(name): k for k, name in enumerate(names)},
        day=day,
        midnight=np.array([d + "T00:00:00" for d in day], dtype=object),
    )


def _universe(snap: Snapshot) -> _Universe:
    key = str(snap.path)
    found = _UNIVERSES.get(key)
    if found is not None:
        return found
    built = _build_universe(snap)
    with _UNIVERSES_LOCK:
        if len(_UNIVERSES) >= _UNIVERSES_KEPT:
            _UNIVERSES.clear()
        _UNIVERSES[key] = built
    return built


# --------------------------------------------------------------------------------------------
# Parameters


def _optional(value: str | None) -> str | None:
    """An optional parameter given empty is the same as absent."""
    return value if value is not None and value.strip() else None


def _required_text(name: str, value: str) -> str:
    text = value.strip()
    if not text:
        raise ApiError("MISSING_PARAMETER", f"parameter {name!r} is empty", parameters=[name])
    return text


def _parse_symbols(value: str, universe: _Universe) -> list[str]:
    """Comma-separated tickers -> known tickers, upper-cased, deduplicated, in order."""
    _required_text("symbols", value)
    symbols = list(dict.fromkeys(s.strip().upper() for s in value.split(",") if s.strip()))
    if not symbols:
        raise ApiError(
            "MISSING_PARAMETER", "parameter 'symbols' names no symbol", parameters=["symbols"]
        )
    if len(symbols) > MAX_SYMBOLS:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{len(symbols)} symbols given; at most {MAX_SYMBOLS} per call",
            parameter="symbols",
            max_symbols=MAX_SYMBOLS,
        )
    unknown = [s for s in symbols if s not in universe.row_of]
    if unknown:
        shown = ", ".join(unknown)
        raise ApiError(
            "TICKER_NOT_FOUND",
            f"unknown symbol{'s' if len(unknown) > 1 else ''}: {shown}",
            parameter="symbols",
            unknown=unknown,
        )
    return symbols


def _parse_date(name: str, value: str) -> np.datetime64:
    text = _required_text(name, value)
    try:
        if not _DATE_RE.match(text):
            raise ValueError
        day = date.fromisoformat(text)
    except ValueError:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{name} {value!r} is not a date; expected YYYY-MM-DD (e.g. 2024-01-31)",
            parameter=name,
            accepted="YYYY-MM-DD",
        ) from None
    return np.datetime64(day, "D")


def _session_range(
    snap: Snapshot, universe: _Universe, start_time: str, end_time: str | None
) -> tuple[int, int]:
    """[lo, hi) indexes into the sessions for the inclusive date range."""
    sessions = snap.sessions.astype("datetime64[D]")
    start = _parse_date("start_time", start_time)
    end_time = _optional(end_time)
    if end_time is None:
        if not len(sessions):
            return 0, 0
        end = sessions[-1]
        if start > end:
            raise ApiError(
                "INVALID_PARAMETER",
                f"start_time {start} is after the latest session {universe.data_as_of} "
                "(the default end_time)",
                parameter="start_time",
                data_as_of=universe.data_as_of,
            )
    else:
        end = _parse_date("end_time", end_time)
        if start > end:
            raise ApiError(
                "INVALID_PARAMETER",
                f"start_time {start} is after end_time {end}",
                parameter="start_time",
            )
    lo = int(np.searchsorted(sessions, start, side="left"))
    hi = int(np.searchsorted(sessions, end, side="right"))
    return lo, hi


def _parse_fields(value: str | None) -> list[str]:
    if value is None or not value.strip():
        return list(DAILY_FIELDS)
    asked = list(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    unknown = [f for f in asked if f not in DAILY_FIELDS and f not in ALWAYS]
    if unknown:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"valid fields: {', '.join(DAILY_FIELDS)}",
            parameter="fields",
            unknown=unknown,
            accepted=list(DAILY_FIELDS),
        )
    return [f for f in asked if f in DAILY_FIELDS]


def _parse_factor(value: str, universe: _Universe) -> int:
    text = _required_text("fact", value)
    k = universe.factor_of.get(_norm_factor(text))
    if k is None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown factor {text!r}; valid factors: {', '.join(universe.factor_names)} "
            "(case-insensitive, spaces or underscores)",
            parameter="fact",
            accepted=universe.factor_names,
        )
    return k


def _choice(name: str, value: str, accepted: Sequence[str]) -> str:
    text = value.strip().lower()
    if text not in accepted:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{name} {value!r} is not accepted; accepted: {', '.join(accepted)}",
            parameter=name,
            accepted=list(accepted),
        )
    return text


def _sector_codes() -> dict[str, str]:
    table = sector_table()
    return dict(zip(table["sector_code"], table["gics_sector"], strict=True))


# --------------------------------------------------------------------------------------------
# Answers


def _headers(universe: _Universe) -> dict[str, str]:
    return {"X-Model-Version": universe.version, "X-Data-As-Of": universe.data_as_of}


def _format(request: Request, value: str | None) -> str:
    """The answer's format, checked before any work: `format`, else Accept, else JSON."""
    return formats.negotiate(request, _optional(value), FORMATS)


def _answer(
    request: Request, fmt: str, universe: _Universe, columns: formats.Columns, filename: str
) -> Response:
    """The rendered answer, with an ETag (304 when the client has it; cached per process)."""
    query = "&".join(f"{k}={v}" for k, v in sorted(request.query_params.multi_items()))
    etag = formats.etag_for(universe.version, request.url.path, query, fmt)
    headers = _headers(universe)
    return formats.cached(
        request,
        etag,
        headers,
        lambda: formats.render(fmt, columns, headers=headers, filename=filename),
    )


def _where_published(
    values: np.ndarray, rows: Sequence[int], lo: int, hi: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row: the session indexes in [lo, hi) where `values` is finite, and those values."""
    where, picked = [], []
    for r in rows:
        block = np.asarray(values[r, lo:hi])
        idx = np.flatnonzero(np.isfinite(block))
        where.append(idx + lo)
        picked.append(block[idx])
    return where, picked


def _concat(parts: list[np.ndarray], dtype: Any = float) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _symbol_series(
    snap: Snapshot,
    universe: _Universe,
    symbols: list[str],
    field: str,
    lo: int,
    hi: int,
    teo: np.ndarray,
    value_name: str,
) -> dict[str, np.ndarray]:
    """Records {teo, symbol, value_name} of one (n x T) array for several symbols."""
    rows = [universe.row_of[s] for s in symbols]
    where, values = _where_published(snap.array(field), rows, lo, hi)
    counts = [len(w) for w in where]
    return {
        "teo": teo[_concat(where, np.int64)],
        "symbol": np.repeat(np.array(symbols, dtype=object), counts),
        value_name: _concat(values),
    }


# --------------------------------------------------------------------------------------------
# Routes

_apikey = APIKeyHeader(
    name="apikey",
    auto_error=False,
    scheme_name="apikey",
    description="Your API key, in the `apikey` header (every Service A route needs one).",
)
router = APIRouter(
    tags=["Service A: daily stock data"],
    dependencies=[Security(_apikey), Depends(daily_caller)],
)

SymbolsParam = Annotated[
    str,
    Query(
        description=(
            f"Comma-separated tickers, case-insensitive (at most {MAX_SYMBOLS}; duplicates are "
            "dropped). An unknown ticker is a 404 naming it."
        ),
        examples=["AAPL,MSFT"],
    ),
]
StartParam = Annotated[
    str,
    Query(
        description="First session, inclusive, YYYY-MM-DD.",
        examples=["2024-01-02"],
        json_schema_extra={"format": "date"},
    ),
]
EndParam = Annotated[
    str | None,
    Query(
        description="Last session, inclusive, YYYY-MM-DD; default: the latest session.",
        examples=["2024-12-31"],
        json_schema_extra={"format": "date"},
    ),
]
FormatParam = Annotated[
    str | None,
    Query(
        description=(
            "`json` (an array of records, the default) or `csv` (a header row, then the rows). "
            "Without it the Accept header decides (text/csv), else JSON."
        ),
        json_schema_extra={"enum": list(FORMATS)},
    ),
]
FactParam = Annotated[
    str,
    Query(
        description=(
            "One factor name: `Mkt` or a GICS sector factor (Energy, Materials, Industrials, "
            "Consumer_Discretionary, Consumer_Staples, Health_Care, Financials, "
            "Information_Technology, Communication_Services, Utilities, Real_Estate); "
            "case-insensitive, spaces or underscores."
        ),
        examples=["Mkt"],
    ),
]


@router.get(
    "/daily",
    operation_id="daily",
    summary="Daily prices, volume, returns, market cap and sector per symbol",
    response_model=list[DailyRecord],
    responses=_responses(),
)
def daily(
    request: Request,
    snap: SnapshotDep,
    symbols: SymbolsParam,
    start_time: StartParam,
    end_time: EndParam = None,
    fields: Annotated[
        str | None,
        Query(
            description=(
                "Comma-separated fields besides `symbol` and `teo` (always present), in the "
                f"order wanted; default: all. Valid: {', '.join(DAILY_FIELDS)}. `close` is "
                "the adjusted close; `close_raw`, `open`, `high`, `low` and `volume` are as "
                "traded; `mktcap` in USD; `turnover` = close as traded x volume."
            ),
            examples=["close,volume"],
        ),
    ] = None,
    format: FormatParam = None,
) -> Response:
    """One record per symbol and session on which the symbol has a price, symbols in the order
    asked, sessions ascending."""
    fmt = _format(request, format)
    universe = _universe(snap)
    tickers = _parse_symbols(symbols, universe)
    wanted = _parse_fields(fields)
    lo, hi = _session_range(snap, universe, start_time, end_time)
    rows = [universe.row_of[s] for s in tickers]
    where, _ = _where_published(snap.array("price_close"), rows, lo, hi)
    counts = [len(w) for w in where]
    columns: dict[str, np.ndarray] = {
        "symbol": np.repeat(np.array(tickers, dtype=object), counts),
        "teo": universe.day[_concat(where, np.int64)],
    }
    for name in wanted:
        source = DAILY_FIELDS[name]
        if source is None:
            per_row = universe.sector_code if name == "sector_code" else universe.sector_name
            columns[name] = np.repeat(per_row[rows], counts)
        else:
            values = snap.array(source)
            columns[name] = _concat([values[r, w] for r, w in zip(rows, where, strict=True)])
    return _answer(request, fmt, universe, columns, "daily")


@router.get(
    "/betas",
    operation_id="betas",
    summary="Factor betas of symbols (Mkt, or the symbol's own sector)",
    response_model=list[BetaRecord],
    responses=_responses(),
)
def betas(
    request: Request,
    snap: SnapshotDep,
    symbols: SymbolsParam,
    fact: FactParam,
    start_time: StartParam,
    end_time: EndParam = None,
    format: FormatParam = None,
) -> Response:
    """The beta of each symbol to one factor, estimated with data up to and including `teo`
    (the residual of the next session uses it). Every symbol is exposed to `Mkt`; a sector
    factor only for the stocks of that sector: other symbols give no rows."""
    fmt = _format(request, format)
    universe = _universe(snap)
    tickers = _parse_symbols(symbols, universe)
    k = _parse_factor(fact, universe)
    lo, hi = _session_range(snap, universe, start_time, end_time)
    if universe.factor_names[k] == MARKET_FACTOR:
        exposed, field = tickers, "beta_mkt"
    else:
        exposed = [s for s in tickers if universe.exposure[universe.row_of[s]] == k]
        field = "beta_sec"
    cols = _symbol_series(snap, universe, exposed, field, lo, hi, universe.day, "factor_beta")
    cols["fact"] = np.full(len(cols["teo"]), universe.factor_names[k], dtype=object)
    return _answer(request, fmt, universe, cols, "betas")


@router.get(
    "/facts",
    operation_id="facts",
    summary="Daily factor returns (Mkt and the GICS sector factors)",
    response_model=list[FactorReturnRecord],
    responses=_responses(not_found=False),
)
def facts(
    request: Request,
    snap: SnapshotDep,
    fact: FactParam,
    start_time: StartParam,
    end_time: EndParam = None,
    format: FormatParam = None,
) -> Response:
    """`Mkt` is the market return; a sector factor is the sector series cleaned of the market
    with the previous session's link beta: f_sec(t) = s(t) - g(t-1) m(t)."""
    fmt = _format(request, format)
    universe = _universe(snap)
    k = _parse_factor(fact, universe)
    lo, hi = _session_range(snap, universe, start_time, end_time)
    block = np.asarray(snap.factor_returns[k, lo:hi])
    idx = np.flatnonzero(np.isfinite(block))
    columns = {
        "teo": universe.midnight[idx + lo],
        "fact": np.full(len(idx), universe.factor_names[k], dtype=object),
        "factor_return": block[idx],
    }
    return _answer(request, fmt, universe, columns, "facts")


@router.get(
    "/gross",
    operation_id="gross",
    summary="Daily gross (simple) returns of symbols",
    response_model=list[GrossReturnRecord],
    responses=_responses(),
)
def gross(
    request: Request,
    snap: SnapshotDep,
    symbols: SymbolsParam,
    start_time: StartParam,
    end_time: EndParam = None,
    format: FormatParam = None,
) -> Response:
    """P(t) / P(t-1) - 1 on the adjusted close, over consecutive priced sessions."""
    fmt = _format(request, format)
    universe = _universe(snap)
    tickers = _parse_symbols(symbols, universe)
    lo, hi = _session_range(snap, universe, start_time, end_time)
    cols = _symbol_series(
        snap, universe, tickers, "return", lo, hi, universe.midnight, "gross_return"
    )
    return _answer(request, fmt, universe, cols, "gross")


@router.get(
    "/resids",
    operation_id="resids",
    summary="Daily residual returns of symbols after the Mkt and sector factors",
    response_model=list[ResidualRecord],
    responses=_responses(),
)
def resids(
    request: Request,
    snap: SnapshotDep,
    symbols: SymbolsParam,
    start_time: StartParam,
    end_time: EndParam = None,
    format: FormatParam = None,
) -> Response:
    """residual_return(t) = gross_return(t) - b_Mkt(t-1) f_Mkt(t) - b_sec(t-1) f_sec(t), with
    the betas of the previous session (no look-ahead); the sector term only for stocks exposed
    to a sector."""
    fmt = _format(request, format)
    universe = _universe(snap)
    tickers = _parse_symbols(symbols, universe)
    lo, hi = _session_range(snap, universe, start_time, end_time)
    cols = _symbol_series(
        snap, universe, tickers, "resid_return", lo, hi, universe.day, "residual_return"
    )
    return _answer(request, fmt, universe, cols, "resids")


@router.get(
    "/symbol_list",
    operation_id="symbol_list",
    summary="Stocks ranked on the latest session by market cap, price, return or volume",
    response_model=SymbolList,
    responses=dict(_ERRORS),
)
def symbol_list(
    snap: SnapshotDep,
    top_n: Annotated[
        int,
        Query(ge=1, le=MAX_TOP_N, description=f"How many symbols, 1 to {MAX_TOP_N}."),
    ] = DEFAULT_TOP_N,
    top_by: Annotated[
        str,
        Query(
            description=(
                "Ranking value on the latest session: mktcap, mktcap_rank, close (adjusted), "
                "return (simple, that session), turnover, volume."
            ),
            json_schema_extra={"enum": list(TOP_BY)},
        ),
    ] = "mktcap",
    ascending: Annotated[
        bool, Query(description="Smallest value first (default: largest first).")
    ] = False,
    sector_code: Annotated[
        str | None,
        Query(
            description=(
                "Only this GICS sector: 10 Energy, 15 Materials, 20 Industrials, 25 Consumer "
                "Discretionary, 30 Consumer Staples, 35 Health Care, 40 Financials, "
                "45 Information Technology, 50 Communication Services, 55 Utilities, "
                "60 Real Estate."
            ),
            examples=["45"],
        ),
    ] = None,
) -> Response:
    """Stocks (not ETFs) ordered by `top_by` on the snapshot's latest session (`X-Data-As-Of`),
    descending unless `ascending`; ties by symbol. Stocks without a value that session (no
    price, delisted) are left out. The order is by the value itself, so `mktcap_rank` with
    `ascending=false` lists the largest rank numbers (smallest companies) first."""
    universe = _universe(snap)
    key = _choice("top_by", _optional(top_by) or "mktcap", list(TOP_BY))
    eligible = universe.is_stock.copy()
    if _optional(sector_code) is not None:
        codes = _sector_codes()
        code = sector_code.strip()
        if code not in codes:
            raise ApiError(
                "INVALID_PARAMETER",
                f"sector_code {sector_code!r} is not a GICS sector code; accepted: "
                + ", ".join(f"{c} ({name})" for c, name in codes.items()),
                parameter="sector_code",
                accepted=list(codes),
            )
        eligible &= universe.sector_code == code
    symbols: list[str] = []
    if len(universe.day):
        values = np.asarray(snap.array(TOP_BY[key])[:, -1])
        rows = np.flatnonzero(eligible & np.isfinite(values))
        ranked = values[rows] if ascending else -values[rows]
        # lexsort: the last key is primary; tickers break ties (ascending).
        order = np.lexsort((universe.tickers[rows].astype(str), ranked))
        symbols = universe.tickers[rows[order[:top_n]]].tolist()
    return formats.json_response({"symbols": symbols}, headers=_headers(universe))
