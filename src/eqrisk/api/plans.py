"""The request planner of Service B: what a request asks for, decided once.

A route renders the plan and `estimate` prices the very same plan (`sizes`), so the estimate
and the charge of a call can never disagree. The plans read the snapshot's one index
(`Snapshot.index`) and word its failures as the API's errors: an unknown ticker is a 404 with
close matches, a symbol without prices in a range that holds sessions a 404 NO_DATA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np

from eqrisk.api.errors import ApiError
from eqrisk.api.params import (
    SEARCH_LIMIT,
    BatchParams,
    EtfReturnsParams,
    HeatmapParams,
    L3Params,
    MetricsParams,
    ReturnsParams,
    TickerReturnsParams,
    TickersParams,
)
from eqrisk.data.master import MAG7
from eqrisk.snapshot.index import RECENT_SESSIONS, Symbol, SymbolIndex, minus_years
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


def _series(snap: Snapshot, sym: Symbol, lo: int, hi: int, start: date, end: date) -> SeriesPlan:
    price = np.asarray(snap.array("price_close")[sym.row, lo:hi])
    return SeriesPlan(sym, lo, hi, np.isfinite(price), start, end)


def plan_years(snap: Snapshot, ticker: str, years: int) -> SeriesPlan:
    idx = snap.index
    sym = lookup(idx, ticker)
    lo, hi, start, end = window(idx, years)
    return _series(snap, sym, lo, hi, start, end)


def _require_type(sym: Symbol, wanted: str, route: str) -> None:
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


def _require_rows(snap: Snapshot, plan: SeriesPlan) -> SeriesPlan:
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


def plan_ticker_returns(snap: Snapshot, p: TickerReturnsParams) -> SeriesPlan:
    return latest(_require_rows(snap, plan_years(snap, p.ticker, p.years)), p.limit)


def plan_returns(snap: Snapshot, p: ReturnsParams) -> SeriesPlan:
    plan = plan_years(snap, p.ticker, p.years)
    _require_type(plan.symbol, "stock", "/api/returns")
    return _require_rows(snap, plan)


def etf_ticker(p: EtfReturnsParams) -> str:
    if p.ticker is None and p.etf is None:
        raise ApiError(
            "MISSING_PARAMETER",
            "missing required parameter: ticker (or etf)",
            parameters=["ticker"],
        )
    if p.ticker is not None and p.etf is not None and p.ticker != p.etf:
        raise ApiError(
            "INVALID_PARAMETER",
            f"ticker={p.ticker} and etf={p.etf} disagree; give one of the two",
            parameters=["ticker", "etf"],
        )
    return p.ticker or p.etf  # type: ignore[return-value]


def plan_etf_returns(snap: Snapshot, p: EtfReturnsParams) -> SeriesPlan:
    plan = plan_years(snap, etf_ticker(p), p.years)
    _require_type(plan.symbol, "etf", "/api/etf-returns")
    return _require_rows(snap, plan)


def market_etfs(idx: SymbolIndex) -> list[str]:
    """The market ETF(s) the snapshot's symbols are decomposed on (SPY by default)."""
    return sorted({s.market_etf for s in idx.symbols.values() if s.market_etf})


def _check_market_etf(idx: SymbolIndex, etf: str | None) -> None:
    accepted = market_etfs(idx)
    if etf is not None and etf not in accepted:
        raise ApiError(
            "INVALID_PARAMETER",
            f"market_factor_etf={etf} is not served: this snapshot decomposes on "
            f"{', '.join(accepted) or 'no market ETF'} only; leave it out or give "
            f"{' or '.join(accepted)}",
            parameter="market_factor_etf",
            accepted=accepted,
        )


def plan_l3(snap: Snapshot, p: L3Params) -> SeriesPlan:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    _check_market_etf(idx, p.market_factor_etf)
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    if p.years is not None and p.from_ is not None:
        raise ApiError(
            "INVALID_PARAMETER",
            f"years={p.years} and from={p.from_} both set the start; give one of the two",
            parameters=["years", "from"],
        )
    end = p.to or idx.data_as_of
    back = p.years or 1
    start = p.from_ or date.fromordinal(minus_years(idx.data_as_of, back).toordinal() + 1)
    if start > end:
        raise ApiError(
            "INVALID_PARAMETER",
            f"from={start} is after to={end}"
            + ("" if p.to else " (to defaults to data_as_of)")
            + "; give from <= to",
            parameters=["from", "to"],
        )
    lo, hi = idx.date_range(start, end)
    return _require_rows(snap, _series(snap, sym, lo, hi, start, end))


def plan_metrics(snap: Snapshot, p: MetricsParams) -> Symbol:
    idx = snap.index
    sym = lookup(idx, p.ticker)
    if sym.last < 0:
        raise no_prices(idx, sym, idx.first_session, idx.data_as_of)
    return sym


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


@dataclass(frozen=True)
class BatchPlan:
    items: dict[str, SeriesPlan | ApiError]  # per distinct ticker, in request order
    metrics: tuple[str, ...]
    years: int
    format: str = "json"

    @property
    def succeeded(self) -> int:
        return sum(not isinstance(v, ApiError) for v in self.items.values())


def plan_batch(snap: Snapshot, p: BatchParams) -> BatchPlan:
    idx = snap.index
    lo, hi, start, end = window(idx, p.years)
    items: dict[str, SeriesPlan | ApiError] = {}
    for ticker in p.tickers:
        sym = resolve(idx, ticker)
        if sym is None:
            items[ticker] = ticker_not_found(idx, [ticker])
            continue
        plan = _series(snap, sym, lo, hi, start, end)
        series_asked = bool({"returns", "hedge_ratios", "l3_decomposition"} & set(p.metrics))
        if sym.last < 0 or (series_asked and plan.rows == 0):
            # fails alone and is not charged, like an unknown ticker
            items[ticker] = no_prices(idx, sym, start, end)
        else:
            items[ticker] = plan
    return BatchPlan(items, tuple(p.metrics), p.years, p.format)


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
