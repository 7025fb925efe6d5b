"""Service A: daily stock data over the current snapshot (paths at the root, key in `apikey`):
what its endpoints share (their modules: `api/endpoints/daily.py`, `betas.py`, `facts.py`,
`symbol_returns.py`, `symbol_list.py`).

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
- `/betas`: every symbol is exposed to `Mkt`; a sector factor only for the stocks of that sector;
  a style factor (the risk model's second layer, where the version has it) only for the stocks
  in that layer on the session. A symbol without the exposure contributes no rows. The beta at `teo` t uses data up to and
  including t; the residual of t+1 uses it.
- `/symbol_list`: stocks only (no ETFs), on the latest session of the snapshot; symbols without
  a value that session are left out; ordered by the value (descending unless `ascending`), ties
  by symbol ascending; `top_n` 1 to `MAX_TOP_N` (500), default 10. No stock with a value (a
  data set without market caps, a sector without stocks) is a 404 NO_DATA saying what to ingest.
  `format=csv` answers a header row `symbol` and one symbol per row, in the JSON order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from eqrisk.api import formats
from eqrisk.api.errors import ApiError
from eqrisk.api.fields import ALWAYS, DAILY_FIELDS
from eqrisk.api.params import MAX_SYMBOLS, iso_date
from eqrisk.api.plans import ticker_not_found
from eqrisk.data.master import sector_table
from eqrisk.snapshot.chunks import FieldArray
from eqrisk.snapshot.index import SymbolIndex, norm_factor
from eqrisk.snapshot.versions import Snapshot

# --------------------------------------------------------------------------------------------
# Parameters


def optional(value: str | None) -> str | None:
    """An optional parameter given empty is the same as absent."""
    return value if value is not None and value.strip() else None


def required_text(name: str, value: str) -> str:
    text = value.strip()
    if not text:
        raise ApiError("MISSING_PARAMETER", f"parameter {name!r} is empty", parameters=[name])
    return text


def parse_symbols(value: str, universe: SymbolIndex) -> list[str]:
    """Comma-separated tickers -> known tickers, upper-cased, deduplicated, in order."""
    required_text("symbols", value)
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


def parse_date(name: str, value: str) -> np.datetime64:
    text = required_text(name, value)
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


def session_range(
    snap: Snapshot, universe: SymbolIndex, start_time: str, end_time: str | None
) -> tuple[int, int]:
    """[lo, hi) indexes into the sessions for the inclusive date range."""
    sessions = snap.sessions.astype("datetime64[D]")
    start = parse_date("start_time", start_time)
    end_time = optional(end_time)
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
        end = parse_date("end_time", end_time)
        if start > end:
            raise ApiError(
                "INVALID_PARAMETER",
                f"start_time {start} is after end_time {end}",
                parameter="start_time",
            )
    lo = int(np.searchsorted(sessions, start, side="left"))
    hi = int(np.searchsorted(sessions, end, side="right"))
    return lo, hi


def parse_fields(value: str | None) -> list[str]:
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


def parse_factor(value: str, universe: SymbolIndex, styles: Sequence[str] = ()) -> int:
    """A factor's position: k < K one of the model's factors (`Mkt`, the sectors), K + j the
    second layer's style factor j (`styles`, the version's; none without the layer)."""
    text = required_text("fact", value)
    k = universe.factor_of.get(norm_factor(text))
    if k is None:
        by_style = {norm_factor(name): j for j, name in enumerate(styles)}
        j = by_style.get(norm_factor(text))
        if j is not None:
            return len(universe.factor_names) + j
        accepted = [*universe.factor_names, *styles]
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown factor {text!r}; valid factors: {', '.join(accepted)} "
            "(case-insensitive, spaces or underscores)",
            parameter="fact",
            accepted=accepted,
        )
    return k


def choice(name: str, value: str, accepted: Sequence[str]) -> str:
    text = value.strip().lower()
    if text not in accepted:
        raise ApiError(
            "INVALID_PARAMETER",
            f"{name} {value!r} is not accepted; accepted: {', '.join(accepted)}",
            parameter=name,
            accepted=list(accepted),
        )
    return text


def sector_codes() -> dict[str, str]:
    table = sector_table()
    return dict(zip(table["sector_code"], table["gics_sector"], strict=True))


# --------------------------------------------------------------------------------------------
# Answers


@dataclass(frozen=True)
class SymbolRange:
    """Known symbols over an inclusive session range, [lo, hi) into the sessions."""

    universe: SymbolIndex
    tickers: list[str]
    lo: int
    hi: int


def symbol_range(
    snap: Snapshot, symbols: str, start_time: str, end_time: str | None
) -> SymbolRange:
    """The checks every per-symbol route makes after the format, in order: symbols, range,
    data (a symbol without a price in a range that holds sessions is NO_DATA)."""
    universe = snap.index
    tickers = parse_symbols(symbols, universe)
    lo, hi = session_range(snap, universe, start_time, end_time)
    require_prices(snap, universe, tickers, lo, hi)
    return SymbolRange(universe, tickers, lo, hi)


def range_tickers(plan: SymbolRange) -> list[str]:
    """The symbols an answer covers (`Endpoint.tickers`)."""
    return plan.tickers


# --------------------------------------------------------------------------------------------
# Answers


def headers(universe: SymbolIndex) -> dict[str, str]:
    return {"X-Model-Version": universe.version, "X-Data-As-Of": universe.data_as_of_text}


def answer(
    request: Request, fmt: str, universe: SymbolIndex, columns: formats.Columns, filename: str
) -> Response:
    """Service A's rows through the shared answer path (canonical query: the query string)."""
    return formats.answer(
        request,
        fmt,
        version=universe.version,
        canonical=request.query_params.multi_items(),
        headers={**headers(universe), "Vary": "Accept"},  # JSON, its columns, or CSV
        make=lambda: columns,
        filename=filename,
    )


def where_published(
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


def concat(parts: list[np.ndarray], dtype: Any = float) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def symbol_series(
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
    where, values = where_published(snap.array(field), rows, lo, hi)
    counts = [len(w) for w in where]
    return {
        "teo": teo[concat(where, np.int64)],
        "symbol": np.repeat(np.array(symbols, dtype=object), counts),
        value_name: concat(values),
    }


def require_prices(
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
