"""The methods of `Client` and `AsyncClient` for the rest of the routes eqrisk answers in the
real Service B client's shapes (docs/decisions/drop-in-routes.md): the batch latest metrics, the
returns decomposition, L*, macro factor series, ETF factor returns, the rankings screen, the
risk index, the industry panel and a universe's members. Each is a call of `dropin`, run by the
client's own `_run`: each method here builds its call, defined once for both clients
(`bind.method`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from eqrisk.client import dropin
from eqrisk.client.bind import method
from eqrisk.client.calls import Call, extra

Symbols = str | Sequence[str]


class DropinMethods:
    """Mixed into `Client` and `AsyncClient`: each method once, bound by `bind.method` to the
    client's kind (its answer, or a coroutine of it)."""

    @method
    def latest_metrics(tickers: Symbols, *, version: str | None = None) -> Call[dict[str, Any]]:
        """GET /api/batch/latest-metrics: the latest /api/metrics entry of each ticker."""
        return extra(dropin.latest_metrics(tickers), version=version)

    @method
    def returns_decomposition(
        ticker: str,
        years: int | None = None,
        *,
        include_lstar: bool | None = None,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """GET /api/returns-decomposition: each session's return split into the ETF layers'
        parts and the residual, per level (and the L* level with include_lstar)."""
        call = dropin.returns_decomposition(ticker, years, include_lstar, threshold)
        return extra(call, market_factor_etf=market_factor_etf, version=version)

    @method
    def lstar(
        ticker: str,
        years: int | None = None,
        *,
        threshold: float | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """GET /api/lstar: the L* hedge level of each session."""
        return extra(
            dropin.lstar(ticker, years, threshold),
            market_factor_etf=market_factor_etf,
            version=version,
        )

    @method
    def batch_lstar(
        tickers: Sequence[str],
        years: int | None = None,
        *,
        threshold: float | None = None,
        format: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any] | pd.DataFrame]:
        """POST /api/batch/lstar: L* of several tickers (JSON as sent; format csv or parquet:
        a frame)."""
        return extra(
            dropin.batch_lstar(tickers, years, threshold),
            format=format,
            market_factor_etf=market_factor_etf,
            version=version,
        )

    @method
    def macro_factors(
        factors: Sequence[str] | None = None,
        *,
        start: str | None = None,
        end: str | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any] | pd.DataFrame]:
        """GET /api/macro-factors: the macro and style factors' daily series (JSON as sent;
        format csv or parquet: a frame)."""
        return extra(dropin.macro_factors(factors, start, end), format=format, version=version)

    @method
    def etf_factor_returns(
        sleeve: str | None = None,
        tickers: Sequence[str] | None = None,
        *,
        teo: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """GET /api/etf/factor-returns: the market and sector ETFs' trailing returns."""
        call = dropin.etf_factor_returns(sleeve, tickers, teo)
        return extra(call, version=version)

    @method
    def screen_rankings(
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
    ) -> Call[pd.DataFrame]:
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
        return extra(call, version=version)

    @method
    def risk_index(
        positions: Mapping[str, float],
        *,
        time_series: bool = False,
        years: int | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """POST /api/portfolio/risk-index: a book's forecast volatility and weighted L3 shares
        (`positions`: ticker -> weight or dollars, > 0)."""
        return extra(dropin.risk_index(positions, time_series, years), version=version)

    @method
    def industry_panel(
        *,
        teo: str | None = None,
        level: str | None = None,
        min_peers: int | None = None,
        by: str | None = None,
        market_factor_etf: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """GET /api/industry-panel: per industry, the mean and spread of the explained-risk
        shares on one session."""
        call = dropin.industry_panel(teo, level, min_peers)
        return extra(call, by=by, market_factor_etf=market_factor_etf, version=version)

    @method
    def universe_members(
        name: str, *, teo: str | None = None, version: str | None = None
    ) -> Call[dict[str, Any]]:
        """GET /api/universe/{name}/members: the members of uni_mc_N or uni_dv_N."""
        return extra(dropin.universe_members(name, teo), version=version)
