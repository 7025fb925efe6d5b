"""The methods of `Client` and `AsyncClient` for the rest of the routes eqrisk answers in the
real Service B client's shapes (docs/decisions/drop-in-routes.md): the batch latest metrics, the
returns decomposition, L*, macro factor series, ETF factor returns, the rankings screen, the
risk index, the industry panel and a universe's members. Each is a call of `dropin`, run by the
client's own `_run`: the sync and async methods are the same call."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import pandas as pd

from eqrisk.client import dropin
from eqrisk.client.calls import Call, extra

T = TypeVar("T")
Symbols = str | Sequence[str]


class DropinMethods:
    """Mixed into `Client`, whose `_run` runs a call and returns its answer."""

    def _run(self, call: Call[T]) -> T:  # pragma: no cover - Client's own _run is called
        raise NotImplementedError

    def latest_metrics(self, tickers: Symbols, *, version: str | None = None) -> dict[str, Any]:
        """GET /api/batch/latest-metrics: the latest /api/metrics entry of each ticker."""
        return self._run(extra(dropin.latest_metrics(tickers), version=version))

    def returns_decomposition(
        self,
        ticker: str,
        years: int | None = None,
        *,
        include_lstar: bool | None = None,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/returns-decomposition: each session's return split into the ETF layers'
        parts and the residual, per level (and the L* level with include_lstar)."""
        call = dropin.returns_decomposition(ticker, years, include_lstar, threshold)
        return self._run(extra(call, market_factor_etf=market_factor_etf, version=version))

    def lstar(
        self,
        ticker: str,
        years: int | None = None,
        *,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/lstar: the L* hedge level of each session."""
        return self._run(
            extra(
                dropin.lstar(ticker, years, threshold),
                market_factor_etf=market_factor_etf,
                version=version,
            )
        )

    def batch_lstar(
        self,
        tickers: Sequence[str],
        years: int | None = None,
        *,
        threshold: float | None = None,
        format: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any] | pd.DataFrame:
        """POST /api/batch/lstar: L* of several tickers (JSON as sent; format csv or parquet:
        a frame)."""
        return self._run(
            extra(
                dropin.batch_lstar(tickers, years, threshold),
                format=format,
                market_factor_etf=market_factor_etf,
                version=version,
            )
        )

    def macro_factors(
        self,
        factors: Sequence[str] | None = None,
        *,
        start: str | None = None,
        end: str | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any] | pd.DataFrame:
        """GET /api/macro-factors: the macro and style factors' daily series (JSON as sent;
        format csv or parquet: a frame)."""
        return self._run(
            extra(dropin.macro_factors(factors, start, end), format=format, version=version)
        )

    def etf_factor_returns(
        self,
        sleeve: str | None = None,
        tickers: Sequence[str] | None = None,
        *,
        teo: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/etf/factor-returns: the market and sector ETFs' trailing returns."""
        call = dropin.etf_factor_returns(sleeve, tickers, teo)
        return self._run(extra(call, version=version))

    def screen_rankings(
        self,
        metric: str,
        cohort: str,
        window: str,
        *,
        limit: int | None = None,
        min_percentile: float | None = None,
        decile: int | None = None,
        sector_filter: str | None = None,
        as_of: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """POST /api/rankings/screen: the ranked stocks of one cell that pass the filters."""
        call = dropin.screen_rankings(
            metric,
            cohort,
            window,
            limit=limit,
            min_percentile=min_percentile,
            decile=decile,
            sector_filter=sector_filter,
            as_of=as_of,
        )
        return self._run(extra(call, version=version))

    def risk_index(
        self,
        positions: Mapping[str, float],
        *,
        time_series: bool = False,
        years: int | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """POST /api/portfolio/risk-index: a book's forecast volatility and weighted L3 shares
        (`positions`: ticker -> weight or dollars, > 0)."""
        return self._run(extra(dropin.risk_index(positions, time_series, years), version=version))

    def industry_panel(
        self,
        *,
        teo: str | None = None,
        level: str | None = None,
        min_peers: int | None = None,
        by: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/industry-panel: per industry, the mean and spread of the explained-risk
        shares on one session."""
        call = dropin.industry_panel(teo, level, min_peers)
        return self._run(extra(call, by=by, market_factor_etf=market_factor_etf, version=version))

    def universe_members(
        self, name: str, *, teo: str | None = None, version: str | None = None
    ) -> dict[str, Any]:
        """GET /api/universe/{name}/members: the members of uni_mc_N or uni_dv_N."""
        return self._run(extra(dropin.universe_members(name, teo), version=version))


class AsyncDropinMethods:
    """Mixed into `AsyncClient`: the same methods, awaited."""

    def _run(self, call: Call[T]) -> Awaitable[T]:  # pragma: no cover - AsyncClient's _run
        raise NotImplementedError

    async def latest_metrics(
        self, tickers: Symbols, *, version: str | None = None
    ) -> dict[str, Any]:
        """GET /api/batch/latest-metrics: the latest /api/metrics entry of each ticker."""
        return await self._run(extra(dropin.latest_metrics(tickers), version=version))

    async def returns_decomposition(
        self,
        ticker: str,
        years: int | None = None,
        *,
        include_lstar: bool | None = None,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/returns-decomposition: each session's return split into the ETF layers'
        parts and the residual, per level (and the L* level with include_lstar)."""
        call = dropin.returns_decomposition(ticker, years, include_lstar, threshold)
        return await self._run(extra(call, market_factor_etf=market_factor_etf, version=version))

    async def lstar(
        self,
        ticker: str,
        years: int | None = None,
        *,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/lstar: the L* hedge level of each session."""
        return await self._run(
            extra(
                dropin.lstar(ticker, years, threshold),
                market_factor_etf=market_factor_etf,
                version=version,
            )
        )

    async def batch_lstar(
        self,
        tickers: Sequence[str],
        years: int | None = None,
        *,
        threshold: float | None = None,
        format: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any] | pd.DataFrame:
        """POST /api/batch/lstar: L* of several tickers (JSON as sent; format csv or parquet:
        a frame)."""
        return await self._run(
            extra(
                dropin.batch_lstar(tickers, years, threshold),
                format=format,
                market_factor_etf=market_factor_etf,
                version=version,
            )
        )

    async def macro_factors(
        self,
        factors: Sequence[str] | None = None,
        *,
        start: str | None = None,
        end: str | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any] | pd.DataFrame:
        """GET /api/macro-factors: the macro and style factors' daily series (JSON as sent;
        format csv or parquet: a frame)."""
        return await self._run(
            extra(dropin.macro_factors(factors, start, end), format=format, version=version)
        )

    async def etf_factor_returns(
        self,
        sleeve: str | None = None,
        tickers: Sequence[str] | None = None,
        *,
        teo: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/etf/factor-returns: the market and sector ETFs' trailing returns."""
        call = dropin.etf_factor_returns(sleeve, tickers, teo)
        return await self._run(extra(call, version=version))

    async def screen_rankings(
        self,
        metric: str,
        cohort: str,
        window: str,
        *,
        limit: int | None = None,
        min_percentile: float | None = None,
        decile: int | None = None,
        sector_filter: str | None = None,
        as_of: str | None = None,
        version: str | None = None,
    ) -> pd.DataFrame:
        """POST /api/rankings/screen: the ranked stocks of one cell that pass the filters."""
        call = dropin.screen_rankings(
            metric,
            cohort,
            window,
            limit=limit,
            min_percentile=min_percentile,
            decile=decile,
            sector_filter=sector_filter,
            as_of=as_of,
        )
        return await self._run(extra(call, version=version))

    async def risk_index(
        self,
        positions: Mapping[str, float],
        *,
        time_series: bool = False,
        years: int | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """POST /api/portfolio/risk-index: a book's forecast volatility and weighted L3 shares
        (`positions`: ticker -> weight or dollars, > 0)."""
        return await self._run(
            extra(dropin.risk_index(positions, time_series, years), version=version)
        )

    async def industry_panel(
        self,
        *,
        teo: str | None = None,
        level: str | None = None,
        min_peers: int | None = None,
        by: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> dict[str, Any]:
        """GET /api/industry-panel: per industry, the mean and spread of the explained-risk
        shares on one session."""
        call = dropin.industry_panel(teo, level, min_peers)
        return await self._run(
            extra(call, by=by, market_factor_etf=market_factor_etf, version=version)
        )

    async def universe_members(
        self, name: str, *, teo: str | None = None, version: str | None = None
    ) -> dict[str, Any]:
        """GET /api/universe/{name}/members: the members of uni_mc_N or uni_dv_N."""
        return await self._run(extra(dropin.universe_members(name, teo), version=version))
