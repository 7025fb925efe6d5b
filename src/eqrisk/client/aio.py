"""`AsyncClient`: the same methods as `Client`, awaited, over httpx.AsyncClient.

The requests and the reading of the answers are `calls.py`'s, shared with `Client`; only the
sending (and the wait before a retried 429, `asyncio.sleep`) differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import pandas as pd

from eqrisk.client import calls, dropin, risk
from eqrisk.client import factors as fx
from eqrisk.client.account_methods import AccountMethods
from eqrisk.client.bind import AsyncRuns
from eqrisk.client.calls import Call, Symbols
from eqrisk.client.client import _Config
from eqrisk.client.dropin_methods import DropinMethods
from eqrisk.client.frames import LastCall, Portfolio
from eqrisk.client.risk import PortfolioRisk, RiskMethods

T = TypeVar("T")


class AsyncClient(_Config, AsyncRuns, DropinMethods, AccountMethods, RiskMethods):
    """A client of both services for asyncio code; configured as `Client` (`transport`: an
    async httpx transport, for example `httpx.ASGITransport(app)` in process)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry_rate_limited: int = 0,
        max_wait: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(url, api_key, retry_rate_limited, max_wait)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, transport=transport, follow_redirects=True
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, call: Call[T]) -> T:
        """One call, retried on 429 as configured; an error answer raises its typed exception."""
        attempts = 0
        while True:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.query(),
                json=call.body,
                headers=call.headers(self.api_key),
            )
            await response.aread()
            self.last_call = LastCall.of(response)
            if response.status_code < 400:
                return call.read(response)
            wait = calls.retry_wait(response, attempts, self.retry_rate_limited, self.max_wait)
            attempts += 1
            await self._sleep(wait)

    # ------------------------------------------------------------------------ Service B

    async def tickers(
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
        return await self._run(
            calls.extra(
                calls.tickers(search, mag7, asset_type, array, include_metadata), version=version
            )
        )

    async def metrics(self, ticker: str, *, version: str | None = None) -> dict[str, Any]:
        """GET /api/metrics/{ticker}: the latest risk snapshot, as the server sends it."""
        return await self._run(calls.extra(calls.metrics(ticker), version=version))

    async def hedge_ratios(self, tickers: Symbols) -> pd.DataFrame:
        """The latest L1/L2/L3 hedge ratios and their ETFs, one row per ticker, from one
        /api/metrics call each (free for the demo key's seven tickers)."""
        names = [tickers] if isinstance(tickers, str) else list(tickers)
        return calls.hedge_frame([calls.hedge_row(await self.metrics(t)) for t in names])

    async def ticker_returns(
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
        return await self._run(
            calls.extra(
                calls.ticker_returns(ticker, years, limit, nocache, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    async def returns(
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
        return await self._run(
            calls.extra(
                calls.returns("/api/returns", ticker, years, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    async def etf_returns(
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
        return await self._run(
            calls.extra(
                calls.returns("/api/etf-returns", ticker, years, format, csv_comment),
                start=start,
                end=end,
                version=version,
            )
        )

    async def l3_decomposition(
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
        return await self._run(calls.extra(call, version=version))

    async def estimate(
        self, endpoint: str, params: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """POST /api/estimate: what a call would cost now (free)."""
        return await self._run(calls.estimate(endpoint, params))

    async def batch_analyze(
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
        return await self._run(
            calls.extra(
                calls.batch_analyze(tickers, metrics, years, format, csv_comment), version=version
            )
        )

    async def portfolio(self, weights: Mapping[str, float], years: int = 1) -> Portfolio:
        """Weighted hedge ratios and ETF hedge notionals of a book (ticker -> weight or dollars)
        from one batch call; tickers the batch cannot analyze are listed in `failed`."""
        return await self._run(calls.portfolio(weights, years))

    async def portfolio_risk(
        self,
        positions: Mapping[str, float],
        *,
        benchmark: str | Mapping[str, float] | None = None,
        date: str | None = None,
        level: str | None = None,
        units: str | None = None,
        version: str | None = None,
    ) -> PortfolioRisk:
        """POST /api/portfolio/risk (see `Client.portfolio_risk`)."""
        call = risk.portfolio_risk(positions, benchmark, date, level, units)
        return await self._run(calls.extra(call, version=version))

    async def factor_covariance(
        self,
        date: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/factor-covariance: F of the session."""
        return await self._run(calls.extra(risk.factor_covariance(date, format), version=version))

    async def specific_risk(
        self,
        date: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /api/specific-risk: H and D of the session."""
        return await self._run(calls.extra(risk.specific_risk(date, format), version=version))

    async def decompose(self, ticker: str, *, version: str | None = None) -> dict[str, Any]:
        """POST /api/decompose: the four-bets decomposition (market, sector, subsector,
        residual shares and hedge ratios) of one stock."""
        return await self._run(calls.extra(dropin.decompose(ticker), version=version))

    async def factor_correlation(
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
        return await self._run(calls.extra(call, version=version))

    async def rankings(
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
        return await self._run(calls.extra(call, version=version))

    async def top_rankings(
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
        return await self._run(calls.extra(call, version=version))

    async def heatmap(
        self, limit: int | None = None, *, version: str | None = None
    ) -> pd.DataFrame:
        """GET /api/heatmap: the largest stocks with their latest return."""
        return await self._run(calls.extra(calls.heatmap(limit), version=version))

    async def balance(self) -> dict[str, Any]:
        """GET /api/balance: the key's balance and this month's usage (free)."""
        return await self._run(calls.balance())

    async def health(self) -> dict[str, Any]:
        """GET /api/health: liveness and the served model version (no key needed)."""
        return await self._run(calls.health())

    async def ready(self) -> dict[str, Any]:
        """GET /api/ready: whether the server can answer keyed calls, with the state of its
        snapshot, database and Redis (no key needed); not ready raises `ServiceUnavailable`."""
        return await self._run(calls.ready())

    # ------------------------------------------------------------------------ Service A

    async def daily(
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
        return await self._run(
            calls.extra(
                calls.series("/daily", symbols, start_time, end_time, format, fields=fields),
                version=version,
            )
        )

    async def betas(
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
        return await self._run(
            calls.extra(
                calls.series("/betas", symbols, start_time, end_time, format, fact=fact),
                version=version,
            )
        )

    async def facts(
        self,
        fact: str,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /facts: daily returns of one factor."""
        return await self._run(
            calls.extra(
                calls.series("/facts", None, start_time, end_time, format, fact=fact),
                version=version,
            )
        )

    async def gross(
        self,
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /gross: daily gross returns of symbols."""
        return await self._run(
            calls.extra(
                calls.series("/gross", symbols, start_time, end_time, format), version=version
            )
        )

    async def resids(
        self,
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """GET /resids: daily residual returns after the Mkt and sector factors."""
        return await self._run(
            calls.extra(
                calls.series("/resids", symbols, start_time, end_time, format), version=version
            )
        )

    async def symbol_list(
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
        return await self._run(
            calls.extra(
                calls.symbol_list(top_n, top_by, ascending, sector_code, format), version=version
            )
        )

    # ------------------------------------------------------------------------ factor frames

    async def factor_names(self, start: str | None = None) -> list[str]:
        """The factors Service A publishes, `Mkt` first (`GET /factor_list`, free; `start` is
        not needed and kept for callers that pass it)."""
        return fx.factor_names(await self._run(fx.factor_list()))

    async def factor_list(
        self, *, format: str | None = None, version: str | None = None
    ) -> list[dict[str, Any]]:
        """GET /factor_list (free): the factors with their level (`L1` market, `L2` sector),
        ETF and GICS sector."""
        return await self._run(calls.extra(fx.factor_list(format), version=version))

    async def factor_returns(
        self, start: str, end: str | None = None, *, factors: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Every factor's daily return (date x factor), one /facts call per factor (free)."""
        names = list(factors) if factors else await self.factor_names(start)
        return fx.returns_frame({n: await self._run(fx.facts_call(n, start, end)) for n in names})

    async def factor_loadings(
        self, tickers: Symbols, start: str, end: str | None = None
    ) -> pd.DataFrame:
        """(date, ticker) x factor: each ticker's beta to `Mkt` and to its sector's factor,
        0.0 to the other sectors, and its style exposures (0.0 outside the layer); from
        /betas, 100 tickers a call per factor (free)."""
        records = await self._run(fx.factor_list())
        names, symbols = fx.factor_names(records), fx.tickers_of(tickers)
        answers = {
            n: [await self._run(c) for c in fx.betas_calls(symbols, n, start, end)] for n in names
        }
        return fx.LoadingParts(names, answers, frozenset(fx.style_factors(records))).frame()
