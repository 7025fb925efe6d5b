"""The methods of `Client` and `AsyncClient` for the routes of both services' specifications:
Service B's (risk metrics, under `/api`, the key as `Authorization: Bearer`), Service A's (daily
data, at the root, the key in the `apikey` header) and the factor list. Each builds the `Call`
of its route (`calls.py`, `dropin.py`, `risk.py`, `factors.py`), or for the methods of several
calls (`hedge_ratios`, `factor_returns`, `factor_loadings`) yields them one by one (`Steps`),
defined once for both clients by `bind.method`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from eqrisk.client import calls, dropin, risk
from eqrisk.client import factors as fx
from eqrisk.client.bind import Steps, method
from eqrisk.client.calls import Call, Symbols
from eqrisk.client.frames import Portfolio
from eqrisk.client.risk import PortfolioRisk


class ServiceBMethods:
    """Mixed into `Client` and `AsyncClient` (module doc): Service B's routes."""

    @method
    def tickers(
        search: str | None = None,
        *,
        mag7: bool | None = None,
        asset_type: str | None = None,
        array: str | None = None,
        include_metadata: bool | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/tickers: the symbol list, the seven large caps, or search hits (free)."""
        return calls.extra(
            calls.tickers(search, mag7, asset_type, array, include_metadata), version=version
        )

    @method
    def metrics(ticker: str, *, version: str | None = None) -> Call[dict[str, Any]]:
        """GET /api/metrics/{ticker}: the latest risk snapshot, as the server sends it."""
        return calls.extra(calls.metrics(ticker), version=version)

    @method
    def hedge_ratios(tickers: Symbols) -> Steps[pd.DataFrame]:
        """The latest L1/L2/L3 hedge ratios and their ETFs, one row per ticker, from one
        /api/metrics call each (free for the demo key's seven tickers)."""
        answers = []
        for ticker in [tickers] if isinstance(tickers, str) else list(tickers):
            answers.append((yield calls.metrics(ticker)))
        return calls.hedge_frame([calls.hedge_row(answer) for answer in answers])

    @method
    def ticker_returns(
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
    ) -> Call[pd.DataFrame]:
        """GET /api/ticker-returns: daily returns with the L1/L2/L3 hedge ratios and shares."""
        return calls.extra(
            calls.ticker_returns(ticker, years, limit, nocache, format, csv_comment),
            start=start,
            end=end,
            version=version,
        )

    @method
    def returns(
        ticker: str,
        years: int = 1,
        *,
        format: str = "parquet",
        csv_comment: bool | None = None,
        start: str | None = None,
        end: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/returns: daily gross returns of a stock."""
        return calls.extra(
            calls.returns("/api/returns", ticker, years, format, csv_comment),
            start=start,
            end=end,
            version=version,
        )

    @method
    def etf_returns(
        ticker: str,
        years: int = 1,
        *,
        format: str = "parquet",
        csv_comment: bool | None = None,
        start: str | None = None,
        end: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/etf-returns: daily gross returns of an ETF (the route's `etf=` is `ticker=`)."""
        return calls.extra(
            calls.returns("/api/etf-returns", ticker, years, format, csv_comment),
            start=start,
            end=end,
            version=version,
        )

    @method
    def l3_decomposition(
        ticker: str,
        *,
        years: int | None = None,
        start: str | None = None,
        end: str | None = None,
        market_factor_etf: str | None = None,
        format: str = "parquet",
        csv_comment: bool | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/l3-decomposition: the L3 hedge ratios and risk shares over time (`start` and
        `end` are the route's `from`/`to`, inclusive YYYY-MM-DD)."""
        call = calls.l3_decomposition(
            ticker, years, start, end, market_factor_etf, format, csv_comment
        )
        return calls.extra(call, version=version)

    @method
    def estimate(endpoint: str, params: Mapping[str, Any] | None = None) -> Call[dict[str, Any]]:
        """POST /api/estimate: what a call would cost now (free)."""
        return calls.estimate(endpoint, params)

    @method
    def batch_analyze(
        tickers: Sequence[str],
        metrics: Sequence[str] | None = None,
        years: int | None = None,
        *,
        format: str | None = None,
        csv_comment: bool | None = None,
        version: str | None = None,
    ) -> Call[Any]:
        """POST /api/batch/analyze: the JSON answer as a dict, or with `format` "parquet" or
        "csv" the long table as a DataFrame."""
        return calls.extra(
            calls.batch_analyze(tickers, metrics, years, format, csv_comment), version=version
        )

    @method
    def portfolio(weights: Mapping[str, float], years: int = 1) -> Call[Portfolio]:
        """Weighted hedge ratios and ETF hedge notionals of a book (ticker -> weight or dollars)
        from one batch call; tickers the batch cannot analyze are listed in `failed`."""
        return calls.portfolio(weights, years)

    @method
    def portfolio_risk(
        positions: Mapping[str, float],
        *,
        benchmark: str | Mapping[str, float] | None = None,
        date: str | None = None,
        level: str | None = None,
        units: str | None = None,
        style_neutral: bool = False,
        version: str | None = None,
    ) -> Call[PortfolioRisk]:
        """POST /api/portfolio/risk: predicted vol, tracking error against `benchmark`, Euler
        contributions per level, factor and position, and the ETF hedge, one frame each.
        `style_neutral=True` adds the factor-ETF legs that neutralise the book's style
        exposures (the answer's `raw["hedge"]["style_neutral"]`)."""
        call = risk.portfolio_risk(positions, benchmark, date, level, units, style_neutral)
        return calls.extra(call, version=version)

    @method
    def factor_covariance(
        date: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/factor-covariance: F of the session (factors x factors, daily)."""
        return calls.extra(risk.factor_covariance(date, format), version=version)

    @method
    def specific_risk(
        date: str | None = None, *, format: str | None = None, version: str | None = None
    ) -> Call[pd.DataFrame]:
        """GET /api/specific-risk: each symbol's exposures H and specific variance D."""
        return calls.extra(risk.specific_risk(date, format), version=version)

    @method
    def decompose(ticker: str, *, version: str | None = None) -> Call[dict[str, Any]]:
        """POST /api/decompose: the four-bets decomposition (market, sector, subsector,
        residual shares and hedge ratios) of one stock."""
        return calls.extra(dropin.decompose(ticker), version=version)

    @method
    def factor_correlation(
        ticker: str | Sequence[str],
        factors: Sequence[str] | None = None,
        *,
        return_type: str | None = None,
        window_days: int | None = None,
        method: str | None = None,
        version: str | None = None,
    ) -> Call[dict[str, Any]]:
        """POST /api/correlation: correlations of a stock's (residual) returns with the macro
        and style factors; a list of tickers answers `{results: [...]}`."""
        call = dropin.factor_correlation(ticker, factors, return_type, window_days, method)
        return calls.extra(call, version=version)

    @method
    def rankings(
        ticker: str,
        *,
        metric: str | None = None,
        cohort: str | None = None,
        window: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/rankings/{ticker}: the stock's cross-sectional ranks, one row per cell."""
        call = dropin.rankings(ticker, metric, cohort, window)
        return calls.extra(call, version=version)

    @method
    def top_rankings(
        metric: str,
        cohort: str,
        window: str,
        limit: int | None = None,
        *,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /api/rankings/top: the best-ranked stocks of one metric, cohort and window."""
        call = dropin.top_rankings(metric, cohort, window, limit)
        return calls.extra(call, version=version)

    @method
    def heatmap(limit: int | None = None, *, version: str | None = None) -> Call[pd.DataFrame]:
        """GET /api/heatmap: the largest stocks with their latest return."""
        return calls.extra(calls.heatmap(limit), version=version)

    @method
    def balance() -> Call[dict[str, Any]]:
        """GET /api/balance: the key's balance and this month's usage (free)."""
        return calls.balance()

    @method
    def health() -> Call[dict[str, Any]]:
        """GET /api/health: liveness and the served model version (no key needed)."""
        return calls.health()

    @method
    def ready() -> Call[dict[str, Any]]:
        """GET /api/ready: whether the server can answer keyed calls, with the state of its
        snapshot, database and Redis (no key needed); not ready raises `ServiceUnavailable`."""
        return calls.ready()


class ServiceAMethods:
    """Mixed into `Client` and `AsyncClient` (module doc): Service A's routes and the factors
    it publishes."""

    @method
    def daily(
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        fields: Symbols | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /daily: prices, volume, returns, market cap and sector per symbol and session."""
        return calls.extra(
            calls.series("/daily", symbols, start_time, end_time, format, fields=fields),
            version=version,
        )

    @method
    def betas(
        symbols: Symbols,
        fact: str,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /betas: factor betas of symbols (Mkt, or each symbol's own sector)."""
        return calls.extra(
            calls.series("/betas", symbols, start_time, end_time, format, fact=fact),
            version=version,
        )

    @method
    def facts(
        fact: str,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /facts: daily returns of one factor."""
        return calls.extra(
            calls.series("/facts", None, start_time, end_time, format, fact=fact),
            version=version,
        )

    @method
    def gross(
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /gross: daily gross returns of symbols."""
        return calls.extra(
            calls.series("/gross", symbols, start_time, end_time, format), version=version
        )

    @method
    def resids(
        symbols: Symbols,
        start_time: str,
        end_time: str | None = None,
        *,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[pd.DataFrame]:
        """GET /resids: daily residual returns after the Mkt and sector factors."""
        return calls.extra(
            calls.series("/resids", symbols, start_time, end_time, format), version=version
        )

    @method
    def symbol_list(
        top_n: int | None = None,
        top_by: str | None = None,
        *,
        ascending: bool | None = None,
        sector_code: str | None = None,
        format: str | None = None,
        version: str | None = None,
    ) -> Call[list[str]]:
        """GET /symbol_list: stocks ranked on the latest session (JSON or CSV on the wire)."""
        return calls.extra(
            calls.symbol_list(top_n, top_by, ascending, sector_code, format), version=version
        )

    @method
    def factor_list(
        *, format: str | None = None, version: str | None = None
    ) -> Call[list[dict[str, Any]]]:
        """GET /factor_list (free): the factors with their level (`L1` market, `L2` sector),
        ETF and GICS sector."""
        return calls.extra(fx.factor_list(format), version=version)

    @method
    def factor_names(start: str | None = None) -> Call[list[str]]:
        """The factors Service A publishes, `Mkt` first (`GET /factor_list`, free; `start` is
        not needed and kept for callers that pass it)."""
        return fx.factor_list().then(fx.factor_names)

    @method
    def factor_returns(
        start: str, end: str | None = None, *, factors: Sequence[str] | None = None
    ) -> Steps[pd.DataFrame]:
        """Every factor's daily return (date x factor), one /facts call per factor (free)."""
        names = list(factors) if factors else fx.factor_names((yield fx.factor_list()))
        parts = {}
        for name in names:
            parts[name] = yield fx.facts_call(name, start, end)
        return fx.returns_frame(parts)

    @method
    def factor_loadings(
        tickers: Symbols, start: str, end: str | None = None
    ) -> Steps[pd.DataFrame]:
        """(date, ticker) x factor: each ticker's beta to `Mkt` and to its sector's factor,
        0.0 to the other sectors, and its style exposures (0.0 outside the layer); from
        /betas, 100 tickers a call per factor (free)."""
        records = yield fx.factor_list()
        names, symbols = fx.factor_names(records), fx.tickers_of(tickers)
        answers: dict[str, list[pd.DataFrame]] = {name: [] for name in names}
        for name in names:
            for call in fx.betas_calls(symbols, name, start, end):
                answers[name].append((yield call))
        return fx.LoadingParts(names, answers, frozenset(fx.style_factors(records))).frame()
