"""Each route of both services described once, without I/O: a `Call` says what to send and how
to read the answer. `Client` runs calls with httpx.Client, `AsyncClient` with httpx.AsyncClient,
so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import pandas as pd

from eqrisk.client.errors import EqriskError, RateLimited, error_from
from eqrisk.client.frames import (
    ETF_FIELDS,
    HR_FIELDS,
    Portfolio,
    entry_values,
    frame_of,
    portfolio_of,
    search_hits,
)

T = TypeVar("T")
U = TypeVar("U")
Symbols = str | Sequence[str]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reader of its (successful) answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None

    def headers(self, api_key: str) -> dict[str, str]:
        """Service B reads `Authorization: Bearer`, Service A the `apikey` header."""
        if self.path.startswith("/api/"):
            return {"Authorization": f"Bearer {api_key}"}
        return {"apikey": api_key}

    def query(self) -> dict[str, Any]:
        """The parameters without the unset ones; booleans as `true`/`false`, lists joined."""
        out: dict[str, Any] = {}
        for name, value in self.params.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            out[name] = value
        return out

    def then(self, after: Callable[[T], U]) -> Call[U]:
        """The same request, its answer read and then passed through `after`."""
        read = self.read
        return Call(self.method, self.path, lambda r: after(read(r)), self.params, self.body)


def extra(call: Call[T], **params: Any) -> Call[T]:
    """`call` with more parameters (the query's, or the JSON body's for a POST); None is unset.
    A `start` drops the `years` the method always sends."""
    given = {k: v for k, v in params.items() if v is not None}
    if not given:
        return call
    if call.method == "POST":
        return Call(call.method, call.path, call.read, call.params, {**(call.body or {}), **given})
    query = {**call.params, **given}
    if "start" in given:
        query.pop("years", None)  # a start replaces the years (the route refuses both)
    return Call(call.method, call.path, call.read, query, call.body)


def retry_wait(response: httpx.Response, attempts: int, retries: int, max_wait: float) -> float:
    """Seconds to wait before retrying a 429 (Retry-After), or the typed exception raised when
    the answer is an error not to retry: any other error, retries used up, or a longer wait
    than `max_wait`."""
    error: EqriskError = error_from(response)
    wait = error.retry_after if isinstance(error, RateLimited) else None
    if wait is None or attempts >= retries or wait > max_wait:
        raise error
    return wait


def _dict(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json())


def _frame(date_column: str) -> Callable[[httpx.Response], pd.DataFrame]:
    return lambda response: frame_of(response, date_column)


def _symbols(response: httpx.Response) -> list[str]:
    if response.headers.get("content-type", "").startswith("text/csv"):
        return [str(s) for s in frame_of(response)["symbol"]]
    return [str(s) for s in response.json()["symbols"]]


def _batch(response: httpx.Response) -> Any:
    kind = response.headers.get("content-type", "")
    return frame_of(response) if "parquet" in kind or "csv" in kind else response.json()


def hedge_row(answer: Mapping[str, Any]) -> dict[str, Any]:
    """One row of `hedge_ratios`: a /api/metrics answer's hedge ratios and ETFs."""
    entry = {"full_metrics": answer, "hedge_levels": answer.get("hedge_levels")}
    values, meta = entry_values(entry)
    row = {"ticker": answer.get("ticker"), "teo": answer.get("teo")}
    row.update({f: values.get(f) for f in HR_FIELDS})
    row.update({k: meta.get(k) for k in ETF_FIELDS})
    return row


def hedge_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["ticker", "teo", *HR_FIELDS, *ETF_FIELDS]).set_index(
        "ticker"
    )


# ------------------------------------------------------------------------------ Service B


def tickers(
    search: str | None,
    mag7: bool | None,
    asset_type: str | None,
    array: str | None,
    include_metadata: bool | None,
) -> Call[pd.DataFrame]:
    params = {"search": search, "mag7": mag7, "asset_type": asset_type, "array": array}
    params["include_metadata"] = include_metadata
    return Call("GET", "/api/tickers", lambda r: search_hits(r.json()), params)


def metrics(ticker: str) -> Call[dict[str, Any]]:
    # One path segment, percent-encoded: a ticker can never name another route or a query.
    return Call("GET", f"/api/metrics/{quote(ticker.strip().upper(), safe='')}", _dict)


def ticker_returns(
    ticker: str,
    years: int,
    limit: int | None,
    nocache: bool | None,
    format: str,
    csv_comment: bool | None,
) -> Call[pd.DataFrame]:
    params = {"ticker": ticker, "years": years, "limit": limit, "nocache": nocache}
    params.update(format=format, csv_comment=csv_comment)
    return Call("GET", "/api/ticker-returns", _frame("date"), params)


def returns(
    path: str, ticker: str, years: int, format: str, csv_comment: bool | None
) -> Call[pd.DataFrame]:
    params = {"ticker": ticker, "years": years, "format": format, "csv_comment": csv_comment}
    return Call("GET", path, _frame("date"), params)


def l3_decomposition(
    ticker: str,
    years: int | None,
    start: str | None,
    end: str | None,
    market_factor_etf: str | None,
    format: str,
    csv_comment: bool | None,
) -> Call[pd.DataFrame]:
    params = {"ticker": ticker, "years": years, "from": start, "to": end}
    params.update(market_factor_etf=market_factor_etf, format=format, csv_comment=csv_comment)
    return Call("GET", "/api/l3-decomposition", _frame("date"), params)


def estimate(endpoint: str, params: Mapping[str, Any] | None) -> Call[dict[str, Any]]:
    body = {"endpoint": endpoint, "params": dict(params or {})}
    return Call("POST", "/api/estimate", _dict, body=body)


def batch_analyze(
    tickers: Sequence[str],
    metrics: Sequence[str] | None,
    years: int | None,
    format: str | None,
    csv_comment: bool | None,
) -> Call[Any]:
    body: dict[str, Any] = {"tickers": list(tickers)}
    if metrics is not None:
        body["metrics"] = list(metrics)
    optional = {"years": years, "format": format, "csv_comment": csv_comment}
    body.update({name: value for name, value in optional.items() if value is not None})
    return Call("POST", "/api/batch/analyze", _batch, body=body)


def portfolio(weights: Mapping[str, float], years: int) -> Call[Portfolio]:
    tickers = [t.strip().upper() for t in weights]
    batch = batch_analyze(tickers, ["full_metrics"], years, None, None)
    return Call(
        batch.method, batch.path, lambda r: portfolio_of(weights, r.json()), body=batch.body
    )


def heatmap(limit: int | None) -> Call[pd.DataFrame]:
    return Call("GET", "/api/heatmap", _frame("teo"), {"limit": limit})


def balance() -> Call[dict[str, Any]]:
    return Call("GET", "/api/balance", _dict)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/api/health", _dict)


def ready() -> Call[dict[str, Any]]:
    return Call("GET", "/api/ready", _dict)


# ------------------------------------------------------------------------------ Service A


def series(
    path: str,
    symbols: Symbols | None,
    start_time: str,
    end_time: str | None,
    format: str | None,
    **extra: Any,
) -> Call[pd.DataFrame]:
    """/daily, /betas, /facts, /gross, /resids: long tables keyed by symbol and `teo`."""
    params = {"symbols": symbols, **extra, "start_time": start_time, "end_time": end_time}
    return Call("GET", path, _frame("teo"), {**params, "format": format})


def symbol_list(
    top_n: int | None,
    top_by: str | None,
    ascending: bool | None,
    sector_code: str | None,
    format: str | None,
) -> Call[list[str]]:
    params = {"top_n": top_n, "top_by": top_by, "ascending": ascending}
    params.update(sector_code=sector_code, format=format)
    return Call("GET", "/symbol_list", _symbols, params)
