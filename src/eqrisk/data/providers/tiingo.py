"""Tiingo (keyed): end-of-day prices from its REST API, read with httpx.

Tiingo has no Python client of its own (the `tiingo` package is a community wrapper of the
same REST call), so the documented call is made directly:
`GET /tiingo/daily/<ticker>/prices?startDate=YYYY-MM-DD&endDate=YYYY-MM-DD&format=json` with
`Authorization: Token <key>` (a header, so the key is in no URL and no access log). The answer
is a JSON list of days: `date` (ISO, midnight UTC), `open`, `high`, `low`, `close` and `volume`
unadjusted, `adjClose` (and `adjOpen`, ...), `divCash` (cash dividend on its ex-date) and
`splitFactor` (new shares per old on its ex-date, 1 otherwise). Errors are JSON
`{"detail": "..."}`: 401/403 for a bad key, 404 for an unknown ticker, 429 over the limits.
The key is the setting `EQRISK_TIINGO_API_KEY`.
"""

from __future__ import annotations

from datetime import date
from typing import Any, ClassVar

import httpx
import pandas as pd

from eqrisk.client.errors import retry_after_of  # the one reader of Retry-After
from eqrisk.data.providers import (
    Access,
    ProviderError,
    RateLimited,
    UnknownSymbol,
    bars,
)
from eqrisk.data.providers.checks import number_list_problem, refused
from eqrisk.data.providers.transport import Answer, get_json

_NUMBERS = ("open", "high", "low", "close", "adjClose", "volume", "divCash", "splitFactor")


def _detail(response: Answer) -> str:
    body: Any = response.body
    if body is None:
        return " ".join(response.text.split())[:120]
    return str(body.get("detail") if isinstance(body, dict) else body)[:200]


def shape_problem(days: Any) -> str | None:
    """Why the answer is not Tiingo's list of days (see the module), or None."""
    if not isinstance(days, list):
        return (
            f"{type(days).__name__ if days is not None else 'a body that is not JSON'}, not a list"
        )
    if not all(isinstance(d, dict) for d in days):
        return "a day that is not an object"
    for day in days:
        text = day.get("date")
        try:
            date.fromisoformat(str(text)[:10])
        except ValueError:
            return f"a date that is not ISO ({text!r:.40})"
    for name in _NUMBERS:
        problem = number_list_problem([d.get(name) for d in days], len(days), name)
        if problem:
            return problem
    return None


class Tiingo:
    name: ClassVar[str] = "tiingo"
    url: ClassVar[str] = "https://api.tiingo.com"
    key_setting: ClassVar[str | None] = "EQRISK_TIINGO_API_KEY"

    def symbol(self, ticker: str) -> str:
        return ticker.strip().upper().replace(".", "-")

    def history(
        self, http: httpx.Client, access: Access, ticker: str, start: date, end: date
    ) -> pd.DataFrame:
        if not access.api_key:
            raise ProviderError(
                "tiingo needs an API token: set EQRISK_TIINGO_API_KEY (environment or eqrisk.toml)"
            )
        symbol = self.symbol(ticker)
        response = get_json(
            http,
            access,
            self.name,
            f"{access.base_url.rstrip('/')}/tiingo/daily/{symbol}/prices",
            params={"startDate": start.isoformat(), "endDate": end.isoformat(), "format": "json"},
            headers={"Authorization": f"Token {access.api_key}", "Accept": "application/json"},
        )
        if response.status_code == 429:
            raise RateLimited(
                f"tiingo: rate limited ({_detail(response)})", retry_after_of(response)
            )
        if response.status_code == 404:
            raise UnknownSymbol(f"tiingo does not know {symbol} ({_detail(response)})")
        if response.status_code in (401, 403):
            raise ProviderError(
                f"tiingo refused the API token ({response.status_code}: {_detail(response)}): "
                "check EQRISK_TIINGO_API_KEY"
            )
        if response.status_code != 200:
            raise ProviderError(
                f"tiingo answered {response.status_code}: {_detail(response)}; try again later"
            )
        days = response.body
        problem = shape_problem(days)
        if problem is not None:
            raise refused(self.name, symbol, problem)
        return bars(
            {
                "date": [str(d["date"])[:10] for d in days],
                "open": [d.get("open") for d in days],
                "high": [d.get("high") for d in days],
                "low": [d.get("low") for d in days],
                "close": [d.get("close") for d in days],
                "adjusted_close": [d.get("adjClose") for d in days],
                "volume": [d.get("volume") for d in days],
                "split_coefficient": [d.get("splitFactor") for d in days],
                "dividend_amount": [d.get("divCash") for d in days],
            }
        )


PROVIDER = Tiingo()
