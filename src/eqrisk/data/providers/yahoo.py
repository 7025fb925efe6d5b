"""Yahoo Finance (keyless): the chart API that yfinance and most notebooks read, with httpx.

Yahoo publishes no client library (yfinance is a community one that scrapes cookies); the
chart call is `GET /v8/finance/chart/<symbol>?period1=<unix>&period2=<unix>&interval=1d
&events=div,splits&includeAdjustedClose=true`. Its answer, `chart.result[0]`:
`timestamp` (seconds, each session's open), `indicators.quote[0]` with `open`, `high`, `low`,
`close`, `volume`, `indicators.adjclose[0].adjclose`, `events.dividends` and `events.splits`
keyed by timestamp (`amount`; `numerator`, `denominator`), and `meta.exchangeTimezoneName`.
Yahoo's `close`, `volume` and dividend amounts are adjusted for the splits that followed; the
raw values are rebuilt here from the splits in the answer, which is why the call always runs
to today (`period2` = now). Errors: 404 with `chart.error` (`Not Found`: an unknown symbol),
429 `Too Many Requests` (plain text).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any, ClassVar

import httpx
import numpy as np
import pandas as pd

from eqrisk.client.errors import retry_after_of  # the one reader of Retry-After
from eqrisk.data.providers import (
    Access,
    ProviderError,
    RateLimited,
    UnknownSymbol,
    bars,
)
from eqrisk.data.providers.checks import is_stamp, number_list_problem, refused, split_ratio
from eqrisk.data.providers.transport import Answer, get_json

USER_AGENT = "Mozilla/5.0 (compatible; eqrisk)"


def _error(response: Answer) -> tuple[str, str]:
    """(code, description) of `chart.error`, else the status and the text."""
    body = response.body
    chart = body.get("chart") if isinstance(body, dict) else None
    error = chart.get("error") if isinstance(chart, dict) else None
    if not isinstance(error, dict):
        return str(response.status_code), " ".join(response.text.split())[:120]
    return str(error.get("code") or response.status_code), str(error.get("description") or "")


_QUOTES = ("open", "high", "low", "close", "volume")


def _events_problem(events: Any) -> str | None:
    """Why `events` is not Yahoo's {splits: {..: {date, numerator, denominator}}, dividends:
    {..: {date, amount}}}, or None."""
    if events is None:
        return None
    if not isinstance(events, dict):
        return "events that are not an object"
    for kind in ("splits", "dividends"):
        table = events.get(kind) or {}
        if not isinstance(table, dict) or not all(isinstance(e, dict) for e in table.values()):
            return f"events.{kind} that are not objects"
        for event in table.values():
            if not is_stamp(event.get("date")):
                return f"a {kind[:-1]} whose date is not a timestamp ({event.get('date')!r:.40})"
            if (
                kind == "splits"
                and split_ratio(event.get("numerator"), event.get("denominator")) is None
            ):
                return (
                    f"an impossible split {event.get('numerator')!r}/{event.get('denominator')!r}"
                )
            if kind == "dividends" and number_list_problem([event.get("amount")], 1, "dividend"):
                return "a dividend amount that is not a number"
    return None


def shape_problem(result: Any) -> str | None:
    """Why `chart.result[0]` is not the documented shape (see the module), or None."""
    if not isinstance(result, dict):
        return "a result that is not an object"
    stamps = result.get("timestamp") or []
    if not isinstance(stamps, list) or not all(is_stamp(t) for t in stamps):
        bad = stamps if not isinstance(stamps, list) else next(t for t in stamps if not is_stamp(t))
        return f"a timestamp that is not a time in seconds ({bad!r:.40})"
    return _indicators_problem(result.get("indicators") or {}, len(stamps)) or _events_problem(
        result.get("events")
    )


def _indicators_problem(indicators: Any, n: int) -> str | None:
    """Why `indicators` (of `n` timestamps) is not the documented shape, or None."""
    quotes = indicators.get("quote") if isinstance(indicators, dict) else None
    adjclose = indicators.get("adjclose") if isinstance(indicators, dict) else None
    quote: Any = quotes[0] if isinstance(quotes, list) and quotes else None
    if not isinstance(quote, dict):
        quote = None if n else {}
    if quote is None:
        return "no indicators.quote object"
    for name in _QUOTES:
        problem = number_list_problem(quote.get(name), n, name)
        if problem:
            return problem
    if adjclose is None:
        return None
    if not (isinstance(adjclose, list) and adjclose and isinstance(adjclose[0], dict)):
        return "an indicators.adjclose that is not a list of objects"
    return number_list_problem(adjclose[0].get("adjclose"), n, "adjclose")


def _days(stamps: list[Any], zone: str) -> pd.DatetimeIndex:
    moments = pd.to_datetime(pd.Series(stamps, dtype="int64"), unit="s", utc=True)
    return pd.DatetimeIndex(moments.dt.tz_convert(zone).dt.tz_localize(None).dt.normalize())


class Yahoo:
    name: ClassVar[str] = "yahoo"
    url: ClassVar[str] = "https://query1.finance.yahoo.com"
    key_setting: ClassVar[str | None] = None

    def symbol(self, ticker: str) -> str:
        return ticker.strip().upper().replace(".", "-")

    def history(
        self, http: httpx.Client, access: Access, ticker: str, start: date, end: date
    ) -> pd.DataFrame:
        symbol = self.symbol(ticker)
        period1 = int(datetime.combine(start, time(0), UTC).timestamp())
        now = datetime.now(UTC) + timedelta(days=1)
        response = get_json(
            http,
            access,
            self.name,
            f"{access.base_url.rstrip('/')}/v8/finance/chart/{symbol}",
            params={
                "period1": period1,
                "period2": int(now.timestamp()),
                "interval": "1d",
                "events": "div,splits",
                "includeAdjustedClose": "true",
            },
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
        )
        if response.status_code == 429:
            raise RateLimited("yahoo: too many requests", retry_after_of(response))
        code, description = _error(response)
        if response.status_code == 404 or code == "Not Found":
            raise UnknownSymbol(f"yahoo does not know {symbol} ({description or code})")
        if response.status_code != 200:
            raise ProviderError(
                f"yahoo answered {response.status_code} {code}: {description}; try again later"
            )
        body = response.body
        chart = body.get("chart") if isinstance(body, dict) else None
        if not isinstance(chart, dict):
            what = "a body that is not JSON" if body is None else "JSON without a chart object"
            raise refused(self.name, symbol, f"{what} ({' '.join(response.text.split())[:60]!r})")
        results = chart.get("result") or []
        if not isinstance(results, list):
            raise refused(self.name, symbol, "a chart.result that is not a list")
        if not results:
            raise UnknownSymbol(f"yahoo has no data for {symbol} ({description or code})")
        problem = shape_problem(results[0])
        if problem is not None:
            raise refused(self.name, symbol, problem)
        frame = self._frame(results[0])
        return frame.loc[frame["date"] <= pd.Timestamp(end)].reset_index(drop=True)

    @staticmethod
    def _frame(result: dict[str, Any]) -> pd.DataFrame:
        zone = str((result.get("meta") or {}).get("exchangeTimezoneName") or "America/New_York")
        stamps = result.get("timestamp") or []
        indicators = result.get("indicators") or {}
        quote = (indicators.get("quote") or [{}])[0]
        adjusted = ((indicators.get("adjclose") or [{}])[0]).get("adjclose")
        days = _days(stamps, zone)
        events = result.get("events") or {}
        splits: dict[pd.Timestamp, float] = {}
        for event in (events.get("splits") or {}).values():
            ratio = split_ratio(event["numerator"], event["denominator"])
            splits[_days([event["date"]], zone)[0]] = float("nan") if ratio is None else ratio
        dividends: dict[pd.Timestamp, float] = {}
        for event in (events.get("dividends") or {}).values():
            dividends[_days([event["date"]], zone)[0]] = float(event["amount"])
        split = np.array([splits.get(d, 1.0) for d in days])
        dividend = np.array([dividends.get(d, 0.0) for d in days])
        # Splits after each day (within the answer, which runs to today): Yahoo's close and
        # dividend are divided by them, its volume multiplied.
        later = np.cumprod(split[::-1])[::-1] / split

        def column(name: str) -> np.ndarray:
            values = quote.get(name) or [None] * len(stamps)
            return np.array([np.nan if v is None else float(v) for v in values], dtype=float)

        frame = bars(
            {
                "date": days,
                "open": column("open") * later,
                "high": column("high") * later,
                "low": column("low") * later,
                "close": column("close") * later,
                "adjusted_close": adjusted if adjusted is not None else [None] * len(stamps),
                "volume": column("volume") / later,
                "split_coefficient": split,
                "dividend_amount": dividend * later,
            }
        )
        return frame.drop_duplicates("date", keep="last").reset_index(drop=True)


PROVIDER = Yahoo()
