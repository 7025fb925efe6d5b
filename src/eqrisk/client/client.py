"""`Client`: one method per route of both eqrisk services, over httpx.

Service B (risk metrics) lives under `/api` with the key as `Authorization: Bearer`; Service A
(daily data) at the root with the key in the `apikey` header. The client sends each the header
it reads. Time series come back as pandas DataFrames (Parquet on the wire where the route has it:
typed columns and no JSON parsing); errors raise the typed exceptions of `errors.py`. What each
method sends is in `calls.py`, shared with `AsyncClient`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import pandas as pd

from eqrisk.client import calls, dropin, risk
from eqrisk.client import factors as fx
from eqrisk.client.account_methods import AccountMethods
from eqrisk.client.bind import Runs
from eqrisk.client.calls import Call, Symbols
from eqrisk.client.dropin_methods import DropinMethods
from eqrisk.client.frames import LastCall, Portfolio
from eqrisk.client.risk import PortfolioRisk, RiskMethods

DEFAULT_URL = "http://127.0.0.1:8000"
DEMO_KEY = "eqrisk-demo"
T = TypeVar("T")


class _Config:
    """Where and how to call: `url` and `api_key` default to `EQRISK_URL` / `EQRISK_API_KEY`,
    then to the local server and the demo key (a trailing `/api` is dropped: both services hang
    off the root). `retry_rate_limited` > 0 waits out a 429 (its Retry-After) and retries that
    many times, but never waits more than `max_wait` seconds at once."""

    def __init__(
        self, url: str | None, api_key: str | None, retry_rate_limited: int, max_wait: float
    ) -> None:
        base = (url or os.environ.get("EQRISK_URL") or DEFAULT_URL).rstrip("/")
        self.url = base.removesuffix("/api")
        self.api_key = api_key or os.environ.get("EQRISK_API_KEY") or DEMO_KEY
        self.retry_rate_limited = retry_rate_limited
        self.max_wait = max_wait
        self.last_call: LastCall | None = None


class _AsyncBridge(httpx.BaseTransport):
    """Runs an async transport (an `httpx.ASGITransport` over the app) under the sync client,
    so the same `Client` works in process: each request in its own short event loop."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def run() -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            # The body as sent (a compressed answer stays compressed): the client decodes it.
            content = b"".join([part async for part in response.aiter_raw()])
            await response.aclose()
            return httpx.Response(response.status_code, headers=response.headers, content=content)

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: the usual case
            return asyncio.run(run())
        # Called from async code (a notebook's loop): a loop of its own in a worker thread.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, run()).result()


class Client(_Config, Runs, DropinMethods, AccountMethods, RiskMethods):
    """A client of both services (see `_Config` for the configuration).

    `transport` is any httpx transport, sync or async (an `httpx.ASGITransport(app)` runs the
    app in process). `last_call` holds the price, balance and model version the server sent
    with the last answer, error or not.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry_rate_limited: int = 0,
        max_wait: float = 60.0,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(url, api_key, retry_rate_limited, max_wait)
        self._sleep = sleep
        if isinstance(transport, httpx.AsyncBaseTransport):
            transport = _AsyncBridge(transport)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, transport=transport, follow_redirects=True
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[T]) -> T:
        """One call, retried on 429 as configured; an error answer raises its typed exception."""
        attempts = 0
        while True:
            response = self._http.request(
                call.method,
                call.path,
                params=call.query(),
                json=call.body,
                headers=call.headers(self.api_key),
            )
            self.last_call = LastCall.of(response)
            if response.status_code < 400:
                return call.read(response)
            wait = calls.retry_wait(response, attempts, self.retry_rate_limited, self.max_wait)
            attempts += 1
            self._sleep(wait)

    # ------------------------------------------------------------------------ Service B

    def tickers(
        self,
        search: str | None = None,
        *,
        mag7: bool | None = None,
        asset_type: str | None = None,
        array: str | None = None,
        include_metadata: bool | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/tickers: the symbol list, the seven large caps, or search hits (free)."""
        return self._run(
            calls.extra(
                calls.tickers(search, mag7, asset_type, array, include_metadata), version=version
            )
        )

    def metrics(self, ticker: str, *, version: str | None = None) -> dict[str, Any]:
        """GET /api/metrics/{ticker}: the latest risk snapshot, as the server sends it."""
        return self._run(calls.extra(calls.metrics(ticker), version=version))

    def hedge_ratios(self, tickers: Symbols) -> pd.DataFrame:
        """The latest L1/L2/L3 hedge ratios and their ETFs, one row per ticker, from one
        /api/metrics call each (free for the demo key's seven tickers)."""
        names = [tickers] if isinstance(tickers, str) else list(tickers)
        return calls.hedge_frame([calls.hedge_row(self.metrics(t)) for t in names])

    def ticker_returns(
        self,
        ticker: str,
        years: int = 1,
        *,
        limit: int | None = None,
        nocache: bool | None = None,
        format: str = "parquet",
        csv_comment: bool | None = None,
        start: str | None = None,
        end: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/ticker-returns: daily returns with the L1/L2/L3 hedge ratios and shares."""
        return self._run(
            calls.extra(
                calls.ticker_returns(ticker, years, limit, nocache, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    def returns(
        self,
        ticker: str,
        years: int = 1,
        *,
        format: str = "parquet",
        csv_comment: bool | None = None,
        start: str | None = None,
        end: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/returns: daily gross returns of a stock."""
        return self._run(
            calls.extra(
                calls.returns("/api/returns", ticker, years, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    def etf_returns(
        self,
        ticker: str,
        years: int = 1,
        *,
        format: str = "parquet",
        csv_comment: bool | None = None,
        start: str | None = None,
        end: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/etf-returns: daily gross returns of an ETF (the route's `etf=` is `ticker=`)."""
        return self._run(
            calls.extra(
                calls.returns("/api/etf-returns", ticker, years, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    def l3_decomposition(
        self,
        ticker: str,
        *,
        years: int | None = None,
        start: str | None = None,
        end: str | None = None,
        market_factor_etf: str | None = None,
        format: str = "parquet",
        csv_comment: bool | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/l3-decomposition: the L3 hedge ratios and risk shares over time (`start` and
        `end` are the route's `from`/`to`, inclusive YYYY-MM-DD)."""
        call = calls.l3_decomposition(
            ticker, years, start, end, market_factor_etf, format, csv_comment
        )
        return self._run(calls.extra(call, version=version))

    def estimate(self, endpoint: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """POST /api/estimate: what a call would cost now (free)."""
        return self._run(calls.estimate(endpoint, params))

    def batch_analyze(
        self,
        tickers: Sequence[str],
        metrics: Sequence[str] | None = None,
        years: int | None = None,
        *,
        format: str | None = None,
        csv_comment: bool | None = None,
        version: str | None = None,
    ) -> Any:
        """POST /api/batch/analyze: the JSON answer as a dict, or with `format` "parquet" or
        "csv" the long table as a DataFrame."""
        return self._run(
            calls.extra(
                calls.batch_analyze(tickers, metrics, years, format, csv_comment), version=version
            )
        )

    def portfolio(self, weights: Mapping[str, float], years: int = 1) -> Portfolio:
        """Weighted hedge ratios and ETF hedge notionals of a book (ticker -> weight or dollars)
        from one batch call; tickers the batch cannot analyze are listed in `failed`."""
        return self._run(calls.portfolio(weights, years))

    def portfolio_risk(
        self,
        positions: Mapping[str, float],
        *,
        benchmark: str | Mapping[str, float] | None = None,
        date: str | None = None,
        level: str | None = None,
        units: str | None = None,
        version: str | None = None,
    ) -> PortfolioRisk:
        """POST /api/portfolio/risk: predicted vol, tracking error against `benchmark`, Euler
        contributions per level, factor and position, and the ETF hedge, one frame each."""
        call = risk.portfolio_risk(positions, benchmark, date, level, units)
        return self._run(calls.extra(call, version=version))

    def factor_covariance(
        self,
        date: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/factor-covariance: F of the session (factors x factors, daily)."""
        return self._run(calls.extra(risk.factor_covariance(date, format), version=version))

    def specific_risk(
        self, date: str | None = None, *, format: str | None = None, version: str | None = None
    ) -> pd.DataFrame:
        """GET /api/specific-risk: each symbol's exposures H and specific variance D."""
        return self._run(calls.extra(risk.specific_risk(date, format), version=version))

    def decompose(self, ticker: str, *, version: str | None = None) -> dict[str, Any]:
        """POST /api/decompose: the four-bets decomposition (market, sector, subsector,
        residual shares and hedge ratios) of one stock."""
        return self._run(calls.extra(dropin.decompose(ticker), version=version))

    def factor_correlation(
        self,
        ticker: str | Sequence[str],
        factors: Sequence[str] | None = None,
        *,
        return_type: str | None = None,
        window_days: int | None = None,
        method: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """POST /api/correlation: correlations of a stock's (residual) returns with the macro
        and style factors; a list of tickers answers `{results: [...]}`."""
        call = dropin.factor_correlation(ticker, factors, return_type, window_days, method)
        return self._run(calls.extra(call, version=version))

    def rankings(
        self,
        ticker: str,
        *,
        metric: str | None = None,
        cohort: str | None = None,
        window: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/rankings/{ticker}: the stock's cross-sectional ranks, one row per cell."""
        call = dropin.rankings(ticker, metric, cohort, window)
        return self._run(calls.extra(call, version=version))

    def top_rankings(
        self,
        metric: str,
        cohort: str,
        window: str,
        limit: int | None = None,
        *,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/rankings/top: the best-ranked stocks of one metric, cohort and window."""
        call = dropin.top_rankings(metric, cohort, window, limit)
        return self._run(calls.extra(call, version=version))

    def heatmap(self, limit: int | None = None, *, version: str | None = None) -> pd.DataFrame:
        """GET /api/heatmap: the largest stocks with their latest return."""
        return self._run(calls.extra(calls.heatmap(limit), version=version))

    def balance(self) -> dict[str, Any]:
        """GET /api/balance: the key's balance and this month's usage (free)."""
        return self._run(calls.balance())

    def health(self) -> dict[str, Any]:
        """GET /api/health: liveness and the served model version (no key needed)."""
        return self._run(calls.health())

    def ready(self) -> dict[str, Any]:
        """GET /api/ready: whether the server can answer keyed calls, with the state of its
        snapshot, database and Redis (no key needed); not ready raises `ServiceUnavailable`."""
        return self._run(calls.ready())

    # ------------------------------------------------------------------------ Service A

    def daily(
        self,
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        fields: Symbols | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /daily: prices, volume, returns, market cap and sector per symbol and session."""
        return self._run(
            calls.extra(
                calls.series("/daily", symbols, start_time, end_time, format, fields=fields),
                version=version,
            )
        )

    def betas(
        self,
        symbols: Symbols,
        fact: str,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /betas: factor betas of symbols (Mkt, or each symbol's own sector)."""
        return self._run(
            calls.extra(
                calls.series("/betas", symbols, start_time, end_time, format, fact=fact),
                version=version,
            )
        )

    def facts(
        self,
        fact: str,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /facts: daily returns of one factor."""
        return self._run(
            calls.extra(
                calls.series("/facts", None, start_time, end_time, format, fact=fact),
                version=version,
            )
        )

    def gross(
        self,
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /gross: daily gross returns of symbols."""
        return self._run(
            calls.extra(
                calls.series("/gross", symbols, start_time, end_time, format), version=version
            )
        )

    def resids(
        self,
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /resids: daily residual returns after the Mkt and sector factors."""
        return self._run(
            calls.extra(
                calls.series("/resids", symbols, start_time, end_time, format), version=version
            )
        )

    def symbol_list(
        self,
        top_n: int | None = None,
        top_by: str | None = None,
        *,
        ascending: bool | None = None,
        sector_code: str | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> list[str]:
        """GET /symbol_list: stocks ranked on the latest session (JSON or CSV on the wire)."""
        return self._run(
            calls.extra(
                calls.symbol_list(top_n, top_by, ascending, sector_code, format), version=version
            )
        )

    # ------------------------------------------------------------------------ factor frames

    def factor_names(self, start: str | None = None) -> list[str]:
        """The factors Service A publishes, `Mkt` first (`GET /factor_list`, free; `start` is
        not needed and kept for callers that pass it)."""
        return fx.factor_names(self._run(fx.factor_list()))

    def factor_list(
        self, *, format: str | None = None, version: str | None = None
    ) -> list[dict[str, Any]]:
        """GET /factor_list (free): the factors with their level (`L1` market, `L2` sector),
        ETF and GICS sector."""
        return self._run(calls.extra(fx.factor_list(format), version=version))

    def factor_returns(
        self, start: str, end: str | None = None, *, factors: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Every factor's daily return (date x factor), one /facts call per factor (free)."""
        names = list(factors) if factors else self.factor_names(start)
        return fx.returns_frame({n: self._run(fx.facts_call(n, start, end)) for n in names})

    def factor_loadings(self, tickers: Symbols, start: str, end: str | None = None) -> pd.DataFrame:
        """(date, ticker) x factor: each ticker's beta to `Mkt` and to its sector's factor,
        0.0 to the other sectors, and its style exposures (0.0 outside the layer); from
        /betas, 100 tickers a call per factor (free)."""
        records = self._run(fx.factor_list())
        names, symbols = fx.factor_names(records), fx.tickers_of(tickers)
        answers = {n: [self._run(c) for c in fx.betas_calls(symbols, n, start, end)] for n in names}
        return fx.LoadingParts(names, answers, frozenset(fx.style_factors(records))).frame()
