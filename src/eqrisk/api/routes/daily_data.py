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
  valid range without sessions (e.g. before the data begins) answers an empty array; a range
  with sessions in which a requested symbol has no price is a 404 NO_DATA naming every such
  symbol with its priced span (a delisted stock asked after its delisting is never a silent
  empty answer).
- Parameters are read by one pydantic model per route through `params.query_of`, as Service B
  reads its own: an unknown parameter is a 400 naming it and listing the accepted ones, a
  repeated one (`symbols=AAPL&symbols=MSFT`) a 400 that asks for one comma-separated value.
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
  by symbol ascending; `top_n` 1 to `MAX_TOP_N` (500), default 10. No stock with a value (a
  data set without market caps, a sector without stocks) is a 404 NO_DATA saying what to ingest.
  `format=csv` answers a header row `symbol` and one symbol per row, in the JSON order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Security
from fastapi.security import APIKeyHeader
from starlette.responses import Response

from eqrisk.api import formats
from eqrisk.api.deps import SnapshotDep, daily_caller
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import ALWAYS, DAILY_FIELDS, TOP_BY
from eqrisk.api.models import (
    BetaRecord,
    DailyRecord,
    FactorReturnRecord,
    GrossReturnRecord,
    ResidualRecord,
    SymbolList,
    daily_responses,
)
from eqrisk.api.params import (
    DAILY_FORMATS,
    MAX_SYMBOLS,
    BetasQuery,
    DailyQuery,
    FactsQuery,
    SymbolListQuery,
    SymbolsQuery,
    iso_date,
    query_of,
)
from eqrisk.api.plans import NO_CAPS_HINT, ticker_not_found
from eqrisk.data.master import sector_table
from eqrisk.snapshot.chunks import FieldArray
from eqrisk.snapshot.index import SymbolIndex, norm_factor
from eqrisk.snapshot.versions import Snapshot

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


def _parse_symbols(value: str, universe: SymbolIndex) -> list[str]:
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
        raise ticker_not_found(
            universe, unknown, parameter="symbols", listing="/symbol_list?top_n=500"
        )
    return symbols


def _parse_date(name: str, value: str) -> np.datetime64:
    text = _required_text(name, value)
    try:
        day = iso_date(text)
    except ValueError:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{name} {value!r} is not a date; expected YYYY-MM-DD (e.g. 2024-01-31)",
            parameter=name,
            accepted="YYYY-MM-DD",
        ) from None
    return np.datetime64(day, "D")


def _session_range(
    snap: Snapshot, universe: SymbolIndex, start_time: str, end_time: str | None
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
                f"start_time {start} is after the latest session {universe.data_as_of_text} "
                "(the default end_time)",
                parameter="start_time",
                data_as_of=universe.data_as_of_text,
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


def _parse_factor(value: str, universe: SymbolIndex) -> int:
    text = _required_text("fact", value)
    k = universe.factor_of.get(norm_factor(text))
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


def _headers(universe: SymbolIndex) -> dict[str, str]:
    return {"X-Model-Version": universe.version, "X-Data-As-Of": universe.data_as_of_text}


def _format(request: Request, value: str | None) -> str:
    """The answer's format, checked before any work: `format`, else Accept, else JSON."""
    return formats.negotiate(request, _optional(value), DAILY_FORMATS)


def _answer(
    request: Request, fmt: str, universe: SymbolIndex, columns: formats.Columns, filename: str
) -> Response:
    """Service A's rows through the shared answer path (canonical query: the query string)."""
    return formats.answer(
        request,
        fmt,
        version=universe.version,
        canonical=request.query_params.multi_items(),
        headers={**_headers(universe), "Vary": "Accept"},  # JSON, its columns, or CSV
        make=lambda: columns,
        filename=filename,
    )


def _where_published(
    values: FieldArray, rows: Sequence[int], lo: int, hi: int
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
    universe: SymbolIndex,
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

# Parameters: one model per route, read by `params.query_of` like Service B's (an unknown or
# repeated parameter is a 400). Values stay text here: what they mean depends on the snapshot
# (symbols, factors) and empty means absent, so the parsers above read them in the route.


def _require_prices(
    snap: Snapshot, universe: SymbolIndex, tickers: list[str], lo: int, hi: int
) -> None:
    """404 NO_DATA naming every symbol without a price in a range that holds sessions (a range
    without sessions, e.g. before the data begins, is simply no rows)."""
    if hi <= lo:
        return
    price = snap.array("price_close")
    empty = [t for t in tickers if not np.isfinite(price[universe.row_of[t], lo:hi]).any()]
    if not empty:
        return
    span = f"{universe.day[lo]} to {universe.day[hi - 1]}"
    priced = {t: universe.by_row.priced[universe.row_of[t]] for t in empty}
    spans = "; ".join(
        f"{t} priced {p[0]} to {p[1]}" if p else f"{t} never priced" for t, p in priced.items()
    )
    raise ApiError(
        "NO_DATA",
        f"no prices from {span} for {', '.join(empty)} ({spans}); leave "
        f"{'them' if len(empty) > 1 else 'it'} out or ask for a range inside the history",
        parameter="symbols",
        symbols=empty,
        priced={t: ({"from": p[0], "to": p[1]} if p else None) for t, p in priced.items()},
    )


def _series_route(
    request: Request, snap: Snapshot, q: SymbolsQuery | BetasQuery | DailyQuery
) -> tuple[str, SymbolIndex, list[str], int, int]:
    """The checks every per-symbol route makes, in order: format, symbols, range, data."""
    fmt = _format(request, q.format)
    universe = snap.index
    tickers = _parse_symbols(q.symbols, universe)
    return fmt, universe, tickers, *_session_range(snap, universe, q.start_time, q.end_time)


@router.get(
    "/daily",
    operation_id="daily",
    summary="Daily prices, volume, returns, market cap and sector per symbol",
    response_model=list[DailyRecord],  # type: ignore[valid-type]
    responses=daily_responses(),
)
def daily(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[DailyQuery, query_of(DailyQuery)],
) -> Response:
    """One record per symbol and session on which the symbol has a price, symbols in the order
    asked, sessions ascending."""
    fmt = _format(request, q.format)
    universe = snap.index
    tickers = _parse_symbols(q.symbols, universe)
    wanted = _parse_fields(q.fields)
    lo, hi = _session_range(snap, universe, q.start_time, q.end_time)
    _require_prices(snap, universe, tickers, lo, hi)
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
            per_row = (
                universe.by_row.sector_code
                if name == "sector_code"
                else universe.by_row.sector_name
            )
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
    responses=daily_responses(),
)
def betas(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[BetasQuery, query_of(BetasQuery)],
) -> Response:
    """The beta of each symbol to one factor, estimated with data up to and including `teo`
    (the residual of the next session uses it). Every symbol is exposed to `Mkt`; a sector
    factor only for the stocks of that sector: other symbols give no rows."""
    fmt = _format(request, q.format)
    universe = snap.index
    tickers = _parse_symbols(q.symbols, universe)
    k = _parse_factor(q.fact, universe)
    lo, hi = _session_range(snap, universe, q.start_time, q.end_time)
    _require_prices(snap, universe, tickers, lo, hi)
    if universe.factor_names[k] == universe.market_factor:
        exposed, field = tickers, "beta_mkt"
    else:
        exposed = [s for s in tickers if universe.by_row.exposure[universe.row_of[s]] == k]
        field = "beta_sec"
    cols = _symbol_series(snap, universe, exposed, field, lo, hi, universe.day, "factor_beta")
    cols["fact"] = np.full(len(cols["teo"]), universe.factor_names[k], dtype=object)
    return _answer(request, fmt, universe, cols, "betas")


@router.get(
    "/facts",
    operation_id="facts",
    summary="Daily factor returns (Mkt and the GICS sector factors)",
    response_model=list[FactorReturnRecord],
    responses=daily_responses(not_found=False),
)
def facts(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[FactsQuery, query_of(FactsQuery)],
) -> Response:
    """`Mkt` is the market return; a sector factor is the sector series cleaned of the market
    with the previous session's link beta: f_sec(t) = s(t) - g(t-1) m(t)."""
    fmt = _format(request, q.format)
    universe = snap.index
    k = _parse_factor(q.fact, universe)
    lo, hi = _session_range(snap, universe, q.start_time, q.end_time)
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
    responses=daily_responses(),
)
def gross(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[SymbolsQuery, query_of(SymbolsQuery)],
) -> Response:
    """P(t) / P(t-1) - 1 on the adjusted close, over consecutive priced sessions."""
    fmt, universe, tickers, lo, hi = _series_route(request, snap, q)
    _require_prices(snap, universe, tickers, lo, hi)
    cols = _symbol_series(
        snap, universe, tickers, "return", lo, hi, universe.midnight, "gross_return"
    )
    return _answer(request, fmt, universe, cols, "gross")


@router.get(
    "/resids",
    operation_id="resids",
    summary="Daily residual returns of symbols after the Mkt and sector factors",
    response_model=list[ResidualRecord],
    responses=daily_responses(),
)
def resids(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[SymbolsQuery, query_of(SymbolsQuery)],
) -> Response:
    """residual_return(t) = gross_return(t) - b_Mkt(t-1) f_Mkt(t) - b_sec(t-1) f_sec(t), with
    the betas of the previous session (no look-ahead); the sector term only for stocks exposed
    to a sector."""
    fmt, universe, tickers, lo, hi = _series_route(request, snap, q)
    _require_prices(snap, universe, tickers, lo, hi)
    cols = _symbol_series(
        snap, universe, tickers, "resid_return", lo, hi, universe.day, "residual_return"
    )
    return _answer(request, fmt, universe, cols, "resids")


def _no_ranking(
    snap: Snapshot, universe: SymbolIndex, key: str, sector: str | None, eligible: np.ndarray
) -> ApiError:
    """NO_DATA for a ranking without any value on the latest session, saying what is missing."""
    as_of = universe.data_as_of_text
    caps = np.asarray(snap.array("market_cap")[:, -1]) if len(universe.day) else np.empty(0)
    if key in ("mktcap", "mktcap_rank") and not np.isfinite(caps[universe.by_row.is_stock]).any():
        detail = f"the data set has no market caps on its latest session {as_of}: {NO_CAPS_HINT}"
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
    )


@router.get(
    "/symbol_list",
    operation_id="symbol_list",
    summary="Stocks ranked on the latest session by market cap, price, return or volume",
    response_model=SymbolList,
    responses=daily_responses(),
)
def symbol_list(
    request: Request,
    snap: SnapshotDep,
    q: Annotated[SymbolListQuery, query_of(SymbolListQuery)],
) -> Response:
    """Stocks (not ETFs) ordered by `top_by` on the snapshot's latest session (`X-Data-As-Of`),
    descending unless `ascending`; ties by symbol. Stocks without a value that session (no
    price, delisted) are left out; when none has one (for example a data set without market
    caps) the answer is a 404 NO_DATA that says what is missing. The order is by the value
    itself, so `mktcap_rank` with `ascending=false` lists the largest rank numbers (smallest
    companies) first. JSON `{symbols}` or CSV (header `symbol`, one row per symbol)."""
    fmt = _format(request, q.format)
    universe = snap.index
    key = _choice("top_by", _optional(q.top_by) or "mktcap", list(TOP_BY))
    eligible = universe.by_row.is_stock.copy()
    code = _optional(q.sector_code)
    if code is not None:
        codes = _sector_codes()
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
        raise _no_ranking(snap, universe, key, code, eligible)
    values = np.asarray(snap.array(TOP_BY[key])[:, -1])
    rows = np.flatnonzero(eligible & np.isfinite(values))
    if not len(rows):
        raise _no_ranking(snap, universe, key, code, eligible)
    ranked = values[rows] if q.ascending else -values[rows]
    # lexsort: the last key is primary; tickers break ties (ascending).
    order = np.lexsort((universe.by_row.tickers[rows].astype(str), ranked))
    symbols = universe.by_row.tickers[rows[order[: q.top_n]]].tolist()
    if fmt == formats.CSV:
        columns = {"symbol": np.array(symbols, dtype=object)}
        return _answer(request, fmt, universe, columns, "symbol_list")
    return formats.json_response({"symbols": symbols}, headers=_headers(universe))
