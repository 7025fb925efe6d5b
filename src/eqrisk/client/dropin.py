"""Calls of the routes eqrisk answers in the real Service B client's shapes beyond the
specification (docs/decisions/drop-in-routes.md): the decomposition, macro factor correlations
and rankings. Described once, run by `Client` and `AsyncClient`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import pandas as pd

from eqrisk.client.calls import Call
from eqrisk.client.frames import frame_of


def _dict(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json())


def _rankings(response: httpx.Response) -> pd.DataFrame:
    """The `rankings` rows as a frame (the answer's other keys in `attrs`)."""
    doc = response.json()
    frame = pd.DataFrame(doc.get("rankings") or [])
    frame.attrs.update({k: v for k, v in doc.items() if k not in ("rankings", "_metadata")})
    return frame


def decompose(ticker: str) -> Call[dict[str, Any]]:
    return Call("POST", "/api/decompose", _dict, body={"ticker": ticker})


def factor_correlation(
    ticker: str | Sequence[str],
    factors: Sequence[str] | None,
    return_type: str | None,
    window_days: int | None,
    method: str | None,
) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"ticker": ticker if isinstance(ticker, str) else list(ticker)}
    optional = {"return_type": return_type, "window_days": window_days, "method": method}
    body.update({k: v for k, v in optional.items() if v is not None})
    if factors is not None:
        body["factors"] = list(factors)
    return Call("POST", "/api/correlation", _dict, body=body)


def rankings(
    ticker: str, metric: str | None, cohort: str | None, window: str | None
) -> Call[pd.DataFrame]:
    params = {"metric": metric, "cohort": cohort, "window": window}
    # One path segment, percent-encoded: a ticker can never name another route or a query.
    return Call("GET", f"/api/rankings/{quote(ticker.strip().upper(), safe='')}", _rankings, params)


def top_rankings(metric: str, cohort: str, window: str, limit: int | None) -> Call[pd.DataFrame]:
    params = {"metric": metric, "cohort": cohort, "window": window, "limit": limit}
    return Call("GET", "/api/rankings/top", _rankings, params)


def _table(response: httpx.Response, date_column: str) -> dict[str, Any] | pd.DataFrame:
    """A JSON answer as sent; a CSV or Parquet one (`format=`) as a frame, dates parsed."""
    kind = response.headers.get("content-type", "")
    if kind.startswith("application/json"):
        return _dict(response)
    return frame_of(response, date_column)


def _macro(response: httpx.Response) -> dict[str, Any] | pd.DataFrame:
    return _table(response, "teo")


def _lstar_table(response: httpx.Response) -> dict[str, Any] | pd.DataFrame:
    return _table(response, "date")


def _optional(**given: Any) -> dict[str, Any]:
    return {k: v for k, v in given.items() if v is not None}


def _names(tickers: str | Sequence[str]) -> list[str]:
    return [tickers] if isinstance(tickers, str) else list(tickers)


def latest_metrics(tickers: str | Sequence[str]) -> Call[dict[str, Any]]:
    return Call("GET", "/api/batch/latest-metrics", _dict, {"tickers": _names(tickers)})


def returns_decomposition(
    ticker: str, years: int | None, include_lstar: bool | None, threshold: float | None
) -> Call[dict[str, Any]]:
    params = _optional(ticker=ticker, years=years, include_lstar=include_lstar, threshold=threshold)
    return Call("GET", "/api/returns-decomposition", _dict, params)


def macro_factors(
    factors: Sequence[str] | None, start: str | None, end: str | None
) -> Call[dict[str, Any] | pd.DataFrame]:
    params = _optional(factors=list(factors) if factors is not None else None, start=start, end=end)
    return Call("GET", "/api/macro-factors", _macro, params)


def etf_factor_returns(
    sleeve: str | None, tickers: Sequence[str] | None, teo: str | None
) -> Call[dict[str, Any]]:
    params = _optional(sleeve=sleeve, tickers=list(tickers) if tickers else None, teo=teo)
    return Call("GET", "/api/etf/factor-returns", _dict, params)


def screen_rankings(metric: str, cohort: str, window: str, **filters: Any) -> Call[pd.DataFrame]:
    """`filters`: limit, min_percentile, decile, sector_filter, as_of (None: unset)."""
    body = {"metric": metric, "cohort": cohort, "window": window, **_optional(**filters)}
    return Call("POST", "/api/rankings/screen", _rankings, body=body)


def lstar(ticker: str, years: int | None, threshold: float | None) -> Call[dict[str, Any]]:
    return Call(
        "GET", "/api/lstar", _dict, _optional(ticker=ticker, years=years, threshold=threshold)
    )


def batch_lstar(
    tickers: Sequence[str], years: int | None, threshold: float | None
) -> Call[dict[str, Any] | pd.DataFrame]:
    body = {"tickers": list(tickers), **_optional(years=years, threshold=threshold)}
    return Call("POST", "/api/batch/lstar", _lstar_table, body=body)


def risk_index(
    positions: Mapping[str, float], time_series: bool, years: int | None
) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {
        "positions": [{"ticker": t, "weight": float(w)} for t, w in positions.items()],
        "timeSeries": time_series,
        **_optional(years=years),
    }
    return Call("POST", "/api/portfolio/risk-index", _dict, body=body)


def industry_panel(
    teo: str | None, level: str | None, min_peers: int | None
) -> Call[dict[str, Any]]:
    params = _optional(teo=teo, level=level, min_peers=min_peers)
    return Call("GET", "/api/industry-panel", _dict, params)


def universe_members(name: str, teo: str | None) -> Call[dict[str, Any]]:
    # One path segment, percent-encoded, as for a ticker.
    path = f"/api/universe/{quote(name.strip(), safe='')}/members"
    return Call("GET", path, _dict, _optional(teo=teo))
