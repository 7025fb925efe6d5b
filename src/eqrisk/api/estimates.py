"""Service B requests: their parameters, their validation against a snapshot, and their cost.

One place decides what a request asks for (the `plan_*` functions), so that a route and the
pre-flight estimate can never disagree: the route renders the plan, `estimate` prices it, and the
accounts layer charges `estimate(...)["estimated_tokens"]` for each successful call.

How a real call maps to `estimate(endpoint, params, ...)`: `endpoint` is the path after `/api/`
(`"ticker-returns"`, `"batch/analyze"`, ...; `"metrics/NVDA"` or `"metrics"` with
`{"ticker": "NVDA"}`), `params` the query parameters (for POST routes the JSON body).

Decisions (also in the OpenAPI descriptions):
- `years=N` covers the sessions strictly after `data_as_of` minus N calendar years, up to and
  including `data_as_of` (Feb 29 maps to Feb 28), where the symbol has a price. N runs from 1 to
  the smallest N that covers the snapshot's whole history (at most 30).
- `l3-decomposition`: `from` defaults to the first day of the `years=1` window; `to` to
  `data_as_of`; both inclusive.
- Unknown parameters are refused (400) everywhere, so a typo never silently changes an answer.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from threading import Lock
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from eqrisk.accounts.pricing import PriceTable, tokens_to_usd
from eqrisk.api.errors import ApiError, validation_api_error
from eqrisk.data.master import MAG7
from eqrisk.model.cascade import CASCADE_FIELDS
from eqrisk.snapshot.store import Snapshot

FORMATS = ("json", "csv", "parquet")
MAX_YEARS = 30
MAX_BATCH_TICKERS = 100
BATCH_METRICS = ("returns", "hedge_ratios", "full_metrics")
DEFAULT_BATCH_METRICS = ("returns", "hedge_ratios")
HEATMAP_DEFAULT, HEATMAP_MAX = 50, 500
HEATMAP_RECENT_SESSIONS = 5  # a stock not priced in the last 5 sessions is off the heatmap
SEARCH_LIMIT = 10
SUGGESTIONS = 3

# Output columns: output name -> snapshot array. The routes render exactly these.
L1_FIELDS, L2_FIELDS, L3_FIELDS = (
    tuple(f for f in CASCADE_FIELDS if f.startswith(level)) for level in ("l1_", "l2_", "l3_")
)
FLOW_FIELDS = ("l1_cfr", "l1_rr", "l2_cfr", "l2_rr", "l3_cfr", "l3_rr")
TICKER_RETURNS_COLUMNS: dict[str, str] = {
    "returns_gross": "return",
    "returns_log": "log_return",
    "price_close": "price_close",
    **{f: f for f in L3_FIELDS + L1_FIELDS + L2_FIELDS + FLOW_FIELDS},
}
RETURNS_COLUMNS: dict[str, str] = {"returns_gross": "return"}
L3_COLUMNS: dict[str, str] = {f: f for f in L3_FIELDS}
HEDGE_RATIO_COLUMNS: dict[str, str] = {f: f for f in ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr")}
METRICS_FIELDS: dict[str, str] = {
    "vol_23d": "vol_23d",
    "vol_252d_ann": "vol_252d_ann",
    "price_close": "price_close",
    "market_cap": "market_cap",
    "return_1d": "return",
    **{f: f for f in L3_FIELDS + L1_FIELDS + L2_FIELDS},
}
HEATMAP_COLUMNS = ("ticker", "company_name", "sector", "industry", "market_cap", "return_1d", "teo")


# --------------------------------------------------------------------------- parameters


def _iso_date(value: Any) -> Any:
    """Dates are `YYYY-MM-DD` and nothing else (no timestamps, no week dates)."""
    if isinstance(value, date):
        return value
    text = value.strip() if isinstance(value, str) else None
    if text is None or len(text) != 10 or text[4] != "-" or text[7] != "-":
        raise ValueError(f"{value!r} is not a date; expected YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a valid calendar date; expected YYYY-MM-DD") from None


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


Ticker = Annotated[
    str,
    StringConstraints(strip_whitespace=True, to_upper=True, min_length=1, max_length=32),
]
IsoDate = Annotated[date, BeforeValidator(_iso_date)]
Format = Annotated[Literal["json", "csv", "parquet"], BeforeValidator(_lower)]
Years = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_YEARS,
        description=(
            "Calendar years of history up to the snapshot's `data_as_of`: the sessions strictly "
            "after `data_as_of` minus `years` years. From 1 to the history the snapshot holds "
            f"(at most {MAX_YEARS}); a larger value is a 400 that names the maximum."
        ),
    ),
]
FORMAT_DESCRIPTION = (
    "Response format: json (default), csv or parquet. Without it the Accept header decides "
    "(application/json, text/csv, application/vnd.apache.parquet)."
)


class Params(BaseModel):
    """Parameters of one endpoint: unknown names are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def accepted(cls) -> list[str]:
        return [f.alias or name for name, f in cls.model_fields.items()]


def reject_unknown(model: type[Params], names: Iterable[str], what: str = "parameter") -> None:
    """400 naming the unknown parameters and listing the accepted ones."""
    accepted = model.accepted()
    unknown = sorted(set(names) - set(accepted))
    if unknown:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown {what}(s): {', '.join(unknown)}; accepted: {', '.join(accepted)}",
            parameters=unknown,
            accepted=accepted,
        )


class BodyParams(Params):
    """A JSON body: unknown fields are refused with the list of accepted ones."""

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(cls.accepted()))
            if unknown:
                raise ValueError(
                    f"unknown field(s): {', '.join(map(str, unknown))}; "
                    f"accepted: {', '.join(cls.accepted())}"
                )
        return data


class TickersParams(Params):
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


class MetricsParams(Params):
    ticker: Ticker = Field(description="Ticker symbol, case-insensitive.", examples=["NVDA"])


class TickerReturnsParams(Params):
    ticker: Ticker = Field(
        description="Ticker symbol (a stock or an ETF), case-insensitive.",
        examples=["NVDA", "AAPL", "SPY"],
    )
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


class ReturnsParams(Params):
    ticker: Ticker = Field(
        description="Stock ticker, case-insensitive (ETFs: /api/etf-returns).",
        examples=["NVDA", "AAPL"],
    )
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


class EtfReturnsParams(Params):
    ticker: Ticker | None = Field(
        None, description="ETF ticker, case-insensitive.", examples=["SPY", "XLK"]
    )
    etf: Ticker | None = Field(None, description="Same as `ticker` (give one of the two).")
    years: Years = 1
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


class L3Params(Params):
    ticker: Ticker = Field(
        description="Ticker symbol, case-insensitive.", examples=["NVDA", "AAPL", "SPY"]
    )
    from_: IsoDate | None = Field(
        None,
        alias="from",
        description="First date, inclusive, YYYY-MM-DD (default: one year before data_as_of).",
    )
    to: IsoDate | None = Field(
        None, description="Last date, inclusive, YYYY-MM-DD (default: data_as_of)."
    )
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


class HeatmapParams(Params):
    limit: int = Field(
        HEATMAP_DEFAULT,
        ge=1,
        le=HEATMAP_MAX,
        description=f"How many stocks, largest market cap first (1 to {HEATMAP_MAX}).",
    )


class BatchParams(BodyParams):
    tickers: list[Ticker] = Field(
        min_length=1,
        max_length=MAX_BATCH_TICKERS,
        description=(
            f"1 to {MAX_BATCH_TICKERS} tickers, case-insensitive; duplicates are merged. An "
            "unknown ticker fails alone (status error) and is not charged."
        ),
        examples=[["NVDA", "AAPL", "SPY", "NOPE"]],
    )
    metrics: list[Literal["returns", "hedge_ratios", "full_metrics"]] = Field(
        default=list(DEFAULT_BATCH_METRICS),
        min_length=1,
        description=(
            "What to return per ticker: returns ([{date, returns_gross}]), hedge_ratios "
            "([{date, l3_mkt_hr, l3_sec_hr, l3_sub_hr}]), full_metrics (as /api/metrics). "
            "Default: returns and hedge_ratios."
        ),
    )
    years: Years = 1

    @field_validator("tickers", "metrics")
    @classmethod
    def _dedupe(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))


class EstimateRequest(BodyParams):
    endpoint: str = Field(
        min_length=1,
        max_length=200,
        description=(
            "The endpoint to price: ticker-returns, returns, etf-returns, metrics (or "
            "metrics/{ticker}), l3-decomposition, batch/analyze, heatmap, tickers; with or "
            "without the /api/ prefix."
        ),
        examples=["ticker-returns"],
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="That endpoint's parameters (query parameters; for batch/analyze its body).",
        examples=[{"ticker": "NVDA", "years": 5}],
    )


def validate_params(model: type[Params], params: Mapping[str, Any]) -> Params:
    """Validate an endpoint's parameters given as a JSON object (`null` = absent)."""
    given = {k: v for k, v in params.items() if v is not None}
    reject_unknown(model, given)
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", "params", *e["loc"])} for e in exc.errors()]
        raise validation_api_error(errors) from None


# --------------------------------------------------------------------------- symbol index


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


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


def minus_years(day: date, years: int) -> date:
    try:
        return day.replace(year=day.year - years)
    except ValueError:  # Feb 29
        return day.replace(year=day.year - years, day=28)


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


class SymbolIndex:
    """What the routes look up per request, built once per snapshot version (no pandas on the
    request path): symbols by ticker, the sorted lists, search columns, the heatmap order."""

    def __init__(self, snap: Snapshot) -> None:
        table = snap.symbols
        sessions = snap.sessions
        self.sessions = sessions
        self.n_sessions = len(sessions)
        # First and last priced sessions come from the table (the build wrote them), so that
        # opening a large snapshot reads no history.
        first = _session_index(sessions, table["first_teo"])
        last = _session_index(sessions, table["latest_teo"])
        self.symbols: dict[str, Symbol] = {}
        for i, rec in enumerate(table.to_dict("records")):
            row = int(rec["row"])
            ticker = str(rec["ticker"])
            self.symbols[ticker] = Symbol(
                ticker=ticker,
                row=row,
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
        self.tickers = sorted(self.symbols)
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
        recent = lasts >= self.n_sessions - HEATMAP_RECENT_SESSIONS
        eligible = np.flatnonzero(
            (self.type_array == "stock") & recent & np.isfinite(self.latest_cap)
        )
        order = np.lexsort((self.ticker_array[eligible], -self.latest_cap[eligible]))
        self.heatmap_order = eligible[order]  # positions into self.tickers
        as_of = sessions[-1].astype(object) if len(sessions) else None
        self.data_as_of: date | None = as_of
        self.first_session: date | None = sessions[0].astype(object) if len(sessions) else None
        self.max_years = 1
        if as_of is not None:
            while self.max_years < MAX_YEARS and minus_years(as_of, self.max_years) >= (
                self.first_session
            ):
                self.max_years += 1

    def lookup(self, ticker: str) -> Symbol:
        """The symbol, or a 404 naming it with up to three close matches."""
        sym = self.symbols.get(ticker)
        if sym is None:
            raise ticker_not_found(ticker, self.suggest(ticker))
        return sym

    def suggest(self, ticker: str) -> list[str]:
        if len(ticker) > 12:
            return []
        return difflib.get_close_matches(ticker, self.tickers, n=SUGGESTIONS, cutoff=0.6)

    def window(self, years: int) -> tuple[int, int, date, date]:
        """Session index range [lo, hi) and the calendar bounds of the last `years` years."""
        self.check_years(years)
        assert self.data_as_of is not None
        start = minus_years(self.data_as_of, years)
        lo = int(np.searchsorted(self.sessions, np.datetime64(start, "D"), side="right"))
        return lo, self.n_sessions, date.fromordinal(start.toordinal() + 1), self.data_as_of

    def check_years(self, years: int) -> None:
        if self.data_as_of is None or years > self.max_years:
            span = f"{self.first_session} to {self.data_as_of}"
            raise ApiError(
                "INVALID_PARAMETER",
                f"years={years} goes beyond the history this snapshot holds ({span}); "
                f"accepted: 1 to {self.max_years}",
                parameter="years",
                minimum=1,
                maximum=self.max_years,
            )

    def date_range(self, start: date, end: date) -> tuple[int, int]:
        lo = int(np.searchsorted(self.sessions, np.datetime64(start, "D"), side="left"))
        hi = int(np.searchsorted(self.sessions, np.datetime64(end, "D"), side="right"))
        return lo, max(lo, hi)


def ticker_not_found(ticker: str, suggestions: list[str]) -> ApiError:
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    return ApiError(
        "TICKER_NOT_FOUND",
        f"ticker {ticker!r} is not in the served universe{hint} (list them with /api/tickers)",
        ticker=ticker,
        suggestions=suggestions,
    )


_INDEX: OrderedDict[tuple[Path, str], SymbolIndex] = OrderedDict()
_INDEX_LOCK = Lock()
_INDEX_KEEP = 3


def symbol_index(snap: Snapshot) -> SymbolIndex:
    """The index of a snapshot version, built on first use and kept for the last few versions."""
    key = (snap.path, snap.version)
    with _INDEX_LOCK:
        found = _INDEX.get(key)
    if found is not None:
        return found
    built = SymbolIndex(snap)
    with _INDEX_LOCK:
        _INDEX[key] = built
        while len(_INDEX) > _INDEX_KEEP:
            _INDEX.popitem(last=False)
    return built


# --------------------------------------------------------------------------- plans


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
        return snap.sessions[self.lo : self.hi][self.mask]

    def column(self, snap: Snapshot, field: str) -> np.ndarray:
        return np.asarray(snap.array(field)[self.symbol.row, self.lo : self.hi])[self.mask]

    def columns(self, snap: Snapshot, mapping: Mapping[str, str]) -> dict[str, np.ndarray]:
        cols = {"date": self.dates(snap)}
        for name, field in mapping.items():
            cols[name] = self.column(snap, field)
        return cols


def _series(snap: Snapshot, sym: Symbol, lo: int, hi: int, start: date, end: date) -> SeriesPlan:
    price = np.asarray(snap.array("price_close")[sym.row, lo:hi])
    return SeriesPlan(sym, lo, hi, np.isfinite(price), start, end)


def plan_years(snap: Snapshot, ticker: str, years: int) -> SeriesPlan:
    idx = symbol_index(snap)
    sym = idx.lookup(ticker)
    lo, hi, start, end = idx.window(years)
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


def plan_ticker_returns(snap: Snapshot, p: TickerReturnsParams) -> SeriesPlan:
    return plan_years(snap, p.ticker, p.years)


def plan_returns(snap: Snapshot, p: ReturnsParams) -> SeriesPlan:
    plan = plan_years(snap, p.ticker, p.years)
    _require_type(plan.symbol, "stock", "/api/returns")
    return plan


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
    return plan


def plan_l3(snap: Snapshot, p: L3Params) -> SeriesPlan:
    idx = symbol_index(snap)
    sym = idx.lookup(p.ticker)
    if idx.data_as_of is None:
        raise ApiError("SERVICE_UNAVAILABLE", "the served snapshot has no sessions")
    end = p.to or idx.data_as_of
    start = p.from_ or date.fromordinal(minus_years(idx.data_as_of, 1).toordinal() + 1)
    if start > end:
        raise ApiError(
            "INVALID_PARAMETER",
            f"from={start} is after to={end}"
            + ("" if p.to else " (to defaults to data_as_of)")
            + "; give from <= to",
            parameters=["from", "to"],
        )
    lo, hi = idx.date_range(start, end)
    return _series(snap, sym, lo, hi, start, end)


def plan_metrics(snap: Snapshot, p: MetricsParams) -> Symbol:
    return symbol_index(snap).lookup(p.ticker)


def plan_heatmap(snap: Snapshot, p: HeatmapParams) -> np.ndarray:
    """Positions (into the index's sorted tickers) of the rows, largest market cap first."""
    return symbol_index(snap).heatmap_order[: p.limit]


@dataclass(frozen=True)
class BatchPlan:
    items: dict[str, SeriesPlan | ApiError]  # per distinct ticker, in request order
    metrics: tuple[str, ...]
    years: int

    @property
    def succeeded(self) -> int:
        return sum(not isinstance(v, ApiError) for v in self.items.values())


def plan_batch(snap: Snapshot, p: BatchParams) -> BatchPlan:
    idx = symbol_index(snap)
    lo, hi, start, end = idx.window(p.years)
    items: dict[str, SeriesPlan | ApiError] = {}
    for ticker in p.tickers:
        sym = idx.symbols.get(ticker)
        if sym is None:
            items[ticker] = ticker_not_found(ticker, idx.suggest(ticker))
        else:
            items[ticker] = _series(snap, sym, lo, hi, start, end)
    return BatchPlan(items, tuple(p.metrics), p.years)


def plan_tickers(snap: Snapshot, p: TickersParams) -> dict[str, Any]:
    """`{tickers: [...]}` or, with `search`, `{query, results: [...]}`."""
    idx = symbol_index(snap)
    keep = np.ones(len(idx.tickers), dtype=bool)
    if p.asset_type is not None:
        keep &= idx.type_array == p.asset_type
    if p.mag7:
        keep &= np.isin(idx.ticker_array, MAG7)
    if p.search is None:
        chosen = idx.ticker_array[keep].tolist()
        if p.mag7:
            chosen = [t for t in MAG7 if t in set(chosen)]
        return {"tickers": chosen, "count": len(chosen)}
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
        results.append(
            {
                "ticker": sym.ticker,
                "company_name": sym.company_name,
                "sector": sym.sector,
                "asset_type": sym.asset_type,
            }
        )
    return {"query": query, "results": results, "count": len(results)}


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Size:
    units: int  # what the price multiplies: 1 per call, succeeded tickers for batch
    rows: int
    bytes: int
    note: str = ""


def _bytes(rows: int, n_float: int, fmt: str, n_text: int = 1) -> int:
    """Approximate body size: JSON ~32 bytes a number, CSV ~20, Parquet ~8 (compressed)."""
    per_cell = {"json": 32, "csv": 20, "parquet": 8}[fmt]
    overhead = {"json": 600, "csv": 400, "parquet": 2500}[fmt]
    return overhead + rows * (n_float * per_cell + n_text * (per_cell + 2))


def _series_size(plan: SeriesPlan, ncols: int, fmt: str | None) -> Size:
    return Size(1, plan.rows, _bytes(plan.rows, ncols, fmt or "json"))


def _size_tickers(snap: Snapshot, p: TickersParams) -> Size:
    doc = plan_tickers(snap, p)
    rows = doc["count"]
    per = 80 if "results" in doc else 8
    return Size(1, rows, 300 + rows * per)


def _size_metrics(snap: Snapshot, p: MetricsParams) -> Size:
    plan_metrics(snap, p)
    return Size(1, 1, 1500)


def _size_ticker_returns(snap: Snapshot, p: TickerReturnsParams) -> Size:
    return _series_size(plan_ticker_returns(snap, p), len(TICKER_RETURNS_COLUMNS), p.format)


def _size_returns(snap: Snapshot, p: ReturnsParams) -> Size:
    return _series_size(plan_returns(snap, p), len(RETURNS_COLUMNS), p.format)


def _size_etf_returns(snap: Snapshot, p: EtfReturnsParams) -> Size:
    return _series_size(plan_etf_returns(snap, p), len(RETURNS_COLUMNS), p.format)


def _size_l3(snap: Snapshot, p: L3Params) -> Size:
    return _series_size(plan_l3(snap, p), len(L3_COLUMNS), p.format)


def _size_heatmap(snap: Snapshot, p: HeatmapParams) -> Size:
    rows = len(plan_heatmap(snap, p))
    return Size(1, rows, 600 + rows * 220)


def _size_batch(snap: Snapshot, p: BatchParams) -> Size:
    plan = plan_batch(snap, p)
    rows = size = 0
    for item in plan.items.values():
        if isinstance(item, ApiError):
            size += 300
            continue
        if "returns" in plan.metrics:
            rows += item.rows
            size += _bytes(item.rows, 1, "json")
        if "hedge_ratios" in plan.metrics:
            rows += item.rows
            size += _bytes(item.rows, 3, "json")
        if "full_metrics" in plan.metrics:
            rows += 1
            size += 1500
    ok = plan.succeeded
    note = f"charged per succeeded ticker: {ok} of {len(plan.items)} requested tickers exist"
    return Size(ok, rows, size + 400, note)


@dataclass(frozen=True)
class Endpoint:
    model: type[Params]
    size: Any  # (Snapshot, Params) -> Size


ENDPOINTS: dict[str, Endpoint] = {
    "ticker-returns": Endpoint(TickerReturnsParams, _size_ticker_returns),
    "returns": Endpoint(ReturnsParams, _size_returns),
    "etf-returns": Endpoint(EtfReturnsParams, _size_etf_returns),
    "metrics": Endpoint(MetricsParams, _size_metrics),
    "l3-decomposition": Endpoint(L3Params, _size_l3),
    "batch/analyze": Endpoint(BatchParams, _size_batch),
    "heatmap": Endpoint(HeatmapParams, _size_heatmap),
    "tickers": Endpoint(TickersParams, _size_tickers),
}


def endpoint_name(endpoint: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Normalize `/api/metrics/NVDA`, `api/ticker-returns`, `heatmap`... to a price-table key
    (a ticker in a metrics path moves into the parameters)."""
    name = endpoint.strip().split("?")[0].strip("/")
    name = name.removeprefix("api/") if name.lower().startswith("api/") else name
    out = dict(params)
    head, _, rest = name.partition("/")
    if head.lower() == "metrics" and rest:
        if "ticker" in out and str(out["ticker"]).strip().upper() != rest.strip().upper():
            raise ApiError(
                "INVALID_PARAMETER",
                f"endpoint names ticker {rest!r} but params.ticker is {out['ticker']!r}",
                parameters=["endpoint", "params.ticker"],
            )
        out["ticker"] = rest
        name = "metrics"
    name = name.lower()
    if name not in ENDPOINTS:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown endpoint {endpoint!r}; accepted: {', '.join(ENDPOINTS)}",
            parameter="endpoint",
            accepted=list(ENDPOINTS),
        )
    return name, out


def estimate(
    endpoint: str, params: Mapping[str, Any], snap: Snapshot, prices: PriceTable
) -> dict[str, Any]:
    """The cost of calling `endpoint` with `params` now: exactly what a successful call is
    charged (`estimated_tokens`), with the rows and approximate bytes it would return.

    Raises ApiError: INVALID_PARAMETER / MISSING_PARAMETER for an unknown endpoint or bad
    parameters (the same checks as the route), TICKER_NOT_FOUND for an unknown ticker of a
    single-ticker endpoint.
    """
    name, params = endpoint_name(endpoint, params)
    spec = ENDPOINTS[name]
    parsed = validate_params(spec.model, params)
    size: Size = spec.size(snap, parsed)
    price = prices[name]
    tokens = price.cost(size.units)
    if price.per == "ticker":
        model = f"per_ticker (minimum {tokens_to_usd(price.minimum_tokens):g} USD per call)"
    else:
        model = "per_call"
    notes = [size.note] if size.note else []
    if tokens == 0:
        notes.append("free" if price.tokens == 0 else "nothing would be charged")
    notes.append("charged only on success; bytes are approximate (JSON unless format says)")
    return {
        "endpoint": name,
        "estimated_cost_usd": tokens_to_usd(tokens),
        "estimated_tokens": tokens,
        "estimated_rows": size.rows,
        "estimated_bytes": size.bytes,
        "unit_cost_usd": price.usd,
        "pricing_model": model,
        "note": "; ".join(notes),
    }
