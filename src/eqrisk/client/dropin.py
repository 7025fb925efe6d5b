"""Calls of the routes eqrisk answers in the real Service B client's shapes beyond the
specification (docs/decisions/drop-in-routes.md): the decomposition, macro factor correlations
and rankings. Described once, run by `Client` and `AsyncClient`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import pandas as pd

from eqrisk.client.calls import Call


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
    return Call("GET", f"/api/rankings/{ticker.strip().upper()}", _rankings, params)


def top_rankings(metric: str, cohort: str, window: str, limit: int | None) -> Call[pd.DataFrame]:
    params = {"metric": metric, "cohort": cohort, "window": window, "limit": limit}
    return Call("GET", "/api/rankings/top", _rankings, params)
