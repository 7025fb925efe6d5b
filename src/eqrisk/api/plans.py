"""What Service B's requests ask for, decided once: the pieces the endpoints' plans share.

Each endpoint's plan (`plan` in its module under `api/endpoints/`) is built from these; its route
renders the plan and its price is the plan's size, so the estimate and the charge of a call can
never disagree. The plans read the snapshot's one index (`Snapshot.index`) and word its failures
as the API's errors: an unknown ticker is a 404 with close matches, a symbol without prices in a
range that holds sessions a 404 NO_DATA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date

import numpy as np

from eqrisk.api.errors import ApiError
from eqrisk.snapshot.chunks import field_span
from eqrisk.snapshot.index import Symbol, SymbolIndex, minus_years
from eqrisk.snapshot.versions import Snapshot

NO_CAPS_HINT = (
    "ingest a master with a shares or market_cap column, or a share-count file "
    "(eqrisk ingest PRICES --master MASTER --shares FILE), then eqrisk build"
)


def ticker_not_found(
    idx: SymbolIndex,
    tickers: list[str],
    *,
    parameter: str = "ticker",
    listing: str = "/api/tickers",
) -> ApiError:
    """The one unknown-ticker error of both services: a 404 naming every unknown ticker
    (`unknown`; `ticker` is the first), with up to three close matches of a single one."""
    suggestions = idx.suggest(tickers[0]) if len(tickers) == 1 else []
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    names = ", ".join(repr(t) for t in tickers)
    verb = "ticker {} is" if len(tickers) == 1 else "tickers {} are"
    return ApiError(
        "TICKER_NOT_FOUND",
        f"{verb.format(names)} not in the served universe{hint} (list them with {listing})",
        ticker=tickers[0],
        unknown=tickers,
        suggestions=suggestions,
        parameter=parameter,
    )


# Share-class twins the real Service B's client sends in place of a demo ticker (it rewrites
# GOOGL to GOOG): when the data set does not hold the twin, it names the listed class.
CLASS_TWINS: dict[str, str] = {"GOOG": "GOOGL"}


def resolve(idx: SymbolIndex, ticker: str) -> Symbol | None:
    """The symbol of `ticker`, or of its class twin when only the twin is served."""
    sym = idx.symbols.get(ticker)
    if sym is None and ticker in CLASS_TWINS:
        sym = idx.symbols.get(CLASS_TWINS[ticker])
    return sym


def lookup(idx: SymbolIndex, ticker: str) -> Symbol:
    """The symbol, or a 404 naming it with up to three close matches."""
    sym = resolve(idx, ticker)
    if sym is None:
        raise ticker_not_found(idx, [ticker])
    return sym


def window(idx: SymbolIndex, years: int) -> tuple[int, int, date, date]:
    """The last `years` years of sessions, or a 400 naming the longest window the data holds."""
    if idx.data_as_of is None or years > idx.max_years:
        span = f"{idx.first_session} to {idx.data_as_of}"
        raise ApiError(
            "INVALID_PARAMETER",
            f"years={years} goes beyond the history this snapshot holds ({span}); "
            f"accepted: 1 to {idx.max_years}",
            parameter="years",
            minimum=1,
            maximum=idx.max_years,
        )
    return idx.window(years)


def no_prices(idx: SymbolIndex, sym: Symbol, start: date | None, end: date | None) -> ApiError:
    """404 NO_DATA: the symbol has no price in a range that holds sessions of the data set."""
    span = idx.priced_span(sym)
    if span is None:
        return ApiError(
            "NO_DATA",
            f"{sym.ticker} has no prices in this data set; ingest prices for it",
            ticker=sym.ticker,
            priced_from=None,
            priced_to=None,
        )
    first, last = span
    return ApiError(
        "NO_DATA",
        f"{sym.ticker} has no prices from {start} to {end}: it is priced from {first} to "
        f"{last}; ask for a range that overlaps its history",
        ticker=sym.ticker,
        priced_from=first,
        priced_to=last,
    )


@dataclass(frozen=True)
class SeriesPlan:
    """The rows of one symbol over a session range: the sessions in [lo, hi) with a price."""

    symbol: Symbol
    lo: int
    hi: int
    mask: np.ndarray  # over [lo, hi): True where the symbol has a price
    start: date  # calendar bounds of the request, inclusive
    end: date

    @property
    def rows(self) -> int:
        return int(self.mask.sum())

    def dates(self, snap: Snapshot) -> np.ndarray:
        out: np.ndarray = snap.sessions[self.lo : self.hi][self.mask]
        return out

    def column(self, snap: Snapshot, field: str) -> np.ndarray:
        row: np.ndarray = np.asarray(snap.array(field)[self.symbol.row, self.lo : self.hi])
        out: np.ndarray = row[self.mask]
        return out

    def columns(self, snap: Snapshot, mapping: Mapping[str, str]) -> dict[str, np.ndarray]:
        cols = {"date": self.dates(snap)}
        for name, field in mapping.items():
            cols[name] = self.column(snap, field)
        return cols


def series_ticker(plan: SeriesPlan) -> tuple[str, ...]:
    """The symbol a series answer covers, as served (`Endpoint.tickers`)."""
    return (plan.symbol.ticker,)


def series_plan(
    snap: Snapshot, sym: Symbol, lo: int, hi: int, start: date, end: date, *, alone: bool = False
) -> SeriesPlan:
    """The sessions of [lo, hi) where `sym` has a price. `alone`: read the price without the
    symbol's other fields (a batch plans many symbols before rendering any: a one-symbol
    answer's plan assembles the whole row, which its renderer then reads from the row cache)."""
    prices = snap.array("price_close")
    price = field_span(prices, sym.row, lo, hi) if alone else np.asarray(prices[sym.row, lo:hi])
    return SeriesPlan(sym, lo, hi, np.isfinite(price), start, end)


def dated_window(
    idx: SymbolIndex, years: int | None, start: date | None, end: date | None
) -> tuple[int, int, date, date]:
    """The sessions a time-series request asks for: `start` to `end` inclusive (`end` default:
    data_as_of), or the last `years` years (default 1) up to `end`. `start` with `years` is a
    400 (both set the start), and so is a start after the end."""
    if start is None and end is None:
        return window(idx, years or 1)
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    if start is not None and years is not None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"years={years} and start={start} both set the start; give one of the two",
            parameters=["years", "start"],
        )
    last = end or idx.data_as_of
    first = start or date.fromordinal(minus_years(last, years or 1).toordinal() + 1)
    if first > last:
        raise ApiError(
            "INVALID_PARAMETER",
            f"start={first} is after end={last}"
            + ("" if end else " (end defaults to data_as_of)")
            + "; give start <= end, both YYYY-MM-DD",
            parameters=["start", "end"],
            accepted="YYYY-MM-DD",
        )
    lo, hi = idx.date_range(first, last)
    return lo, hi, first, last


def span_name(params: object, plan: SeriesPlan) -> str:
    """A file name's span: `5y` for the last years, `START_END` for dates asked."""
    if getattr(params, "start", None) is None and getattr(params, "end", None) is None:
        return f"{getattr(params, 'years', 1)}y"
    return f"{plan.start}_{plan.end}"


def plan_years(
    snap: Snapshot,
    ticker: str,
    years: int | None,
    start: date | None = None,
    end: date | None = None,
) -> SeriesPlan:
    """The rows of `ticker` over `dated_window` (`years` None: not given)."""
    idx = snap.index
    sym = lookup(idx, ticker)
    lo, hi, first, last = dated_window(idx, years, start, end)
    return series_plan(snap, sym, lo, hi, first, last)


def require_type(sym: Symbol, wanted: str, route: str) -> None:
    if sym.asset_type == wanted:
        return
    other = {"stock": "/api/returns", "etf": "/api/etf-returns"}.get(sym.asset_type)
    use = other or "/api/ticker-returns"
    raise ApiError(
        "INVALID_PARAMETER",
        f"{sym.ticker} is {'an' if sym.asset_type[0] in 'aeiou' else 'a'} {sym.asset_type}; "
        f"{route} serves {wanted}s only: use {use}",
        parameter="ticker",
        asset_type=sym.asset_type,
        use=use,
    )


def require_rows(snap: Snapshot, plan: SeriesPlan) -> SeriesPlan:
    """A range that holds sessions but no price of the symbol is NO_DATA (404, free), never an
    empty 200; a range without any session of the data set stays a 200 with no rows."""
    if plan.rows == 0 and plan.hi > plan.lo:
        raise no_prices(snap.index, plan.symbol, plan.start, plan.end)
    return plan


def latest(plan: SeriesPlan, limit: int | None) -> SeriesPlan:
    """The plan cut to its most recent `limit` priced rows (the request bounds stay)."""
    if limit is None or plan.rows <= limit:
        return plan
    mask = plan.mask.copy()
    mask[: np.flatnonzero(mask)[-limit]] = False
    return SeriesPlan(plan.symbol, plan.lo, plan.hi, mask, plan.start, plan.end)


def market_etfs(idx: SymbolIndex) -> list[str]:
    """The market ETF(s) the snapshot's symbols are decomposed on (SPY by default)."""
    return sorted({s.market_etf for s in idx.symbols.values() if s.market_etf})


@dataclass(frozen=True)
class BatchPlan:
    items: dict[str, SeriesPlan | ApiError]  # per distinct ticker, in request order
    metrics: tuple[str, ...]
    years: int
    format: str = "json"

    @property
    def succeeded(self) -> int:
        return sum(not isinstance(v, ApiError) for v in self.items.values())
