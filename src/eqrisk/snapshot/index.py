"""The lookups of one snapshot version, built once per version (`Snapshot.index`).

Both services ask the same questions of a snapshot on every request (which row is this ticker,
what is its sector factor, when was it last priced, which stocks lead by market cap); answering
them from pandas per request would be slow, and two indexes with two cache policies disagreed
on when to rebuild. So one `SymbolIndex` per `Snapshot` object, kept by the snapshot itself
(`Snapshot.index`, a cached property): no global cache, gone with the version it indexes.

The index raises nothing of the HTTP layer: a lookup that fails returns None and the caller
words the error.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from eqrisk.model.cascade import CASCADE_FIELDS
from eqrisk.model.run import MARKET_FACTOR

if TYPE_CHECKING:
    import pandas as pd

    from eqrisk.snapshot.chunks import FieldArray


class Snapshot(Protocol):
    """What the index reads of a version (`version.Snapshot`, which keeps its index: so this
    module imports it not)."""

    @property
    def version(self) -> str: ...
    @property
    def manifest(self) -> dict[str, Any]: ...
    @property
    def sessions(self) -> np.ndarray: ...
    @property
    def symbols(self) -> pd.DataFrame: ...
    @property
    def factor_names(self) -> list[str]: ...
    def array(self, field: str) -> FieldArray: ...


MAX_YEARS = 30  # the longest `years=` window any route takes
RECENT_SESSIONS = 5  # a stock not priced in the last 5 sessions is off the heatmap
SUGGESTIONS = 3

# The cascade's published fields per level, in the model's order (the API reads them here so
# that it never imports the model).
L1_FIELDS, L2_FIELDS, L3_FIELDS = (
    tuple(f for f in CASCADE_FIELDS if f.startswith(level)) for level in ("l1_", "l2_", "l3_")
)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _is_day(value: object) -> bool:
    """A date cell of the symbols table (None, NaT or NaN: never priced)."""
    return value is not None and value == value and str(value) not in ("", "NaT", "None")


def norm_factor(name: str) -> str:
    """'information technology' == 'Information_Technology' == 'INFORMATION  TECHNOLOGY'."""
    return re.sub(r"[\s_]+", "_", name.strip()).casefold()


def minus_years(day: date, years: int) -> date:
    """The same calendar day `years` earlier (Feb 29 maps to Feb 28); `date.min` when that
    year is before year 1 (a caller's `end=0001-01-01`: no session is that early)."""
    if day.year - years < date.min.year:
        return date.min
    try:
        return day.replace(year=day.year - years)
    except ValueError:  # Feb 29
        return day.replace(year=day.year - years, day=28)


@dataclass(frozen=True)
class Symbol:
    """One symbol of a snapshot, with its classification and priced session range."""

    ticker: str
    row: int
    asset_type: str
    company_name: str
    sector: str | None
    industry: str | None
    market_etf: str | None
    sector_etf: str | None
    subsector_etf: str | None
    first: int  # first priced session index, -1 when never priced
    last: int  # last priced session index, -1 when never priced

    def meta(self) -> dict[str, Any]:
        return {
            "company_name": self.company_name,
            "sector": self.sector,
            "industry": self.industry,
            "asset_type": self.asset_type,
            "market_etf": self.market_etf,
            "sector_etf": self.sector_etf,
            "subsector_etf": self.subsector_etf,
        }


def _session_index(sessions: np.ndarray, days: Any) -> np.ndarray:
    """Index of each day in `sessions` (-1 for a missing day or one that is not a session)."""
    values = np.array(
        [np.datetime64(d, "D") if d is not None and d == d else np.datetime64("NaT") for d in days],
        dtype="datetime64[D]",
    )
    pos = np.searchsorted(sessions, values)
    ok = ~np.isnat(values) & (pos < len(sessions))
    ok[ok] &= sessions[pos[ok]] == values[ok]
    return np.where(ok, pos, -1)


@dataclass(frozen=True)
class RowView:
    """Per array row (not per sorted ticker): what Service A slices by row."""

    tickers: np.ndarray  # (n,) object
    is_stock: np.ndarray  # (n,) bool
    sector_code: np.ndarray  # (n,) object: str | None
    sector_name: np.ndarray  # (n,) object: str | None
    exposure: np.ndarray  # (n,) int: index of the sector factor, -1 = market only
    priced: np.ndarray  # (n,) object: (first, last) priced session "YYYY-MM-DD", or None


def _row_view(snap: Snapshot, factor_names: list[str]) -> RowView:
    table = snap.symbols
    n = len(table)
    rows = table["row"].to_numpy(dtype=np.int64)

    def by_row(values: Any, dtype: Any = object) -> np.ndarray:
        out = np.empty(n, dtype=dtype)
        out[rows] = values
        return out

    position = {name: k for k, name in enumerate(factor_names)}
    exposure = np.full(n, -1, dtype=np.int64)
    exposure[rows] = [position.get(_text(v) or "", -1) for v in table["sector_factor"]]
    exposure[exposure == position.get(MARKET_FACTOR, -2)] = -1
    priced = [
        (str(a)[:10], str(b)[:10]) if _is_day(a) and _is_day(b) else None
        for a, b in zip(table["first_teo"], table["latest_teo"], strict=True)
    ]
    return RowView(
        tickers=by_row(table["ticker"].to_numpy(dtype=object)),
        is_stock=by_row((table["asset_type"] == "stock").to_numpy(), bool),
        sector_code=by_row([_text(v) for v in table["sector_code"]]),
        sector_name=by_row([_text(v) for v in table["gics_sector"]]),
        exposure=exposure,
        priced=by_row(priced),
    )


class SymbolIndex:
    """What the routes look up per request, built once per snapshot version (no pandas on the
    request path): symbols by ticker, the sorted lists, search columns, the heatmap order, the
    per-row view and the factors."""

    def __init__(self, snap: Snapshot) -> None:
        table = snap.symbols
        sessions = snap.sessions
        self.version = snap.version
        self.sessions = sessions
        self.n_sessions = len(sessions)
        # First and last priced sessions come from the table (the build wrote them), so that
        # opening a large snapshot reads no history.
        first = _session_index(sessions, table["first_teo"])
        last = _session_index(sessions, table["latest_teo"])
        self.symbols: dict[str, Symbol] = {}
        for i, rec in enumerate(table.to_dict("records")):
            ticker = str(rec["ticker"])
            self.symbols[ticker] = Symbol(
                ticker=ticker,
                row=int(rec["row"]),
                asset_type=_text(rec.get("asset_type")) or "stock",
                company_name=_text(rec.get("name")) or ticker,
                sector=_text(rec.get("gics_sector")),
                industry=_text(rec.get("gics_sub_industry")),
                market_etf=_text(rec.get("market_etf")),
                sector_etf=_text(rec.get("sector_etf")),
                subsector_etf=_text(rec.get("subsector_etf")),
                first=int(first[i]),
                last=int(last[i]),
            )
        self.row_of = {s.ticker: s.row for s in self.symbols.values()}
        self.tickers = sorted(self.symbols)
        self._sorted_arrays(snap)
        self._session_bounds(snap)
        self.market_factor = MARKET_FACTOR
        self.factor_names = snap.factor_names
        self.factor_of = {norm_factor(name): k for k, name in enumerate(self.factor_names)}
        self.by_row = _row_view(snap, self.factor_names)

    def _sorted_arrays(self, snap: Snapshot) -> None:
        """Columns over the sorted tickers: search, the latest cap and return, heatmap order."""
        syms = [self.symbols[t] for t in self.tickers]
        self.ticker_array = np.array(self.tickers, dtype=str)
        self.name_array = np.array([s.company_name.lower() for s in syms], dtype=str)
        self.type_array = np.array([s.asset_type for s in syms], dtype=str)
        rows = np.array([s.row for s in syms], dtype=np.int64)
        lasts = np.array([s.last for s in syms], dtype=np.int64)
        cap = snap.array("market_cap")
        ret = snap.array("return")
        ok = lasts >= 0
        self.latest_cap = np.full(len(syms), np.nan)
        self.latest_return = np.full(len(syms), np.nan)
        self.latest_cap[ok] = cap[rows[ok], lasts[ok]]
        self.latest_return[ok] = ret[rows[ok], lasts[ok]]
        recent = lasts >= self.n_sessions - RECENT_SESSIONS
        stock = self.type_array == "stock"
        self.stocks_with_cap = int((stock & np.isfinite(self.latest_cap)).sum())
        eligible = np.flatnonzero(stock & recent & np.isfinite(self.latest_cap))
        order = np.lexsort((self.ticker_array[eligible], -self.latest_cap[eligible]))
        self.heatmap_order = eligible[order]  # positions into self.tickers

    def _session_bounds(self, snap: Snapshot) -> None:
        """data_as_of, the first session, the longest `years=` window, the session labels."""
        sessions = self.sessions
        as_of = sessions[-1].astype(object) if len(sessions) else None
        self.data_as_of: date | None = as_of
        self.first_session: date | None = sessions[0].astype(object) if len(sessions) else None
        self.max_years = 1
        if as_of is not None and self.first_session is not None:
            while self.max_years < MAX_YEARS and minus_years(as_of, self.max_years) >= (
                self.first_session
            ):
                self.max_years += 1
        day = np.datetime_as_string(sessions.astype("datetime64[D]"), unit="D").astype(object)
        self.day = day  # (T,) "YYYY-MM-DD"
        self.midnight = np.array([d + "T00:00:00" for d in day], dtype=object)
        self.data_as_of_text = str(snap.manifest.get("data_as_of") or (day[-1] if len(day) else ""))

    def sessions_behind(self, sym: Symbol) -> int | None:
        """Sessions of the snapshot after the symbol's last price (0: priced on data_as_of)."""
        return None if sym.last < 0 else self.n_sessions - 1 - sym.last

    def suggest(self, ticker: str) -> list[str]:
        """Up to three known tickers close to an unknown one."""
        if len(ticker) > 12:
            return []
        return difflib.get_close_matches(ticker, self.tickers, n=SUGGESTIONS, cutoff=0.6)

    def window(self, years: int) -> tuple[int, int, date, date]:
        """Session index range [lo, hi) and the calendar bounds of the last `years` years (the
        caller checks `years` against `max_years` first)."""
        assert self.data_as_of is not None
        start = minus_years(self.data_as_of, years)
        lo = int(np.searchsorted(self.sessions, np.datetime64(start, "D"), side="right"))
        return lo, self.n_sessions, date.fromordinal(start.toordinal() + 1), self.data_as_of

    def date_range(self, start: date, end: date) -> tuple[int, int]:
        """Session index range [lo, hi) of the inclusive calendar range."""
        lo = int(np.searchsorted(self.sessions, np.datetime64(start, "D"), side="left"))
        hi = int(np.searchsorted(self.sessions, np.datetime64(end, "D"), side="right"))
        return lo, max(lo, hi)

    def priced_span(self, sym: Symbol) -> tuple[date, date] | None:
        """First and last priced session of a symbol, None when never priced."""
        if sym.last < 0:
            return None
        first: date = self.sessions[sym.first].astype(object)
        last: date = self.sessions[sym.last].astype(object)
        return first, last
