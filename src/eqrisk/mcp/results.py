"""What the MCP tools answer: typed results (their JSON schema is the tool's output schema)
built from the routes' answers as `eqrisk.client` returns them. Every result carries `charge`:
what the call cost and the balance left, from the route's own headers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from eqrisk.client import LastCall, Portfolio

SESSIONS_PER_YEAR = 252
SHORT = {"market": "mkt", "sector": "sec", "subsector": "sub", "residual": "res"}


def _number(value: Any) -> float | None:
    """A finite float, else None (JSON has no NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class Charge(BaseModel):
    """What the eqrisk call behind a tool cost, from the route's headers."""

    cost_usd: float = Field(description="USD charged for this call (0 for free routes).")
    balance_usd: float | None = Field(description="The account's balance after it (USD).")
    model_version: str | None = Field(description="The snapshot version that answered.")
    data_as_of: str | None = Field(description="Last session in that snapshot (YYYY-MM-DD).")
    request_id: str | None = Field(description="Quote it to the operator about this call.")

    @classmethod
    def of(cls, calls: list[LastCall | None]) -> Charge:
        """The sum of the costs of `calls`, with the last call's balance and lineage."""
        done = [c for c in calls if c is not None]
        last = done[-1] if done else None
        return cls(
            cost_usd=round(sum(c.cost_usd or 0.0 for c in done), 10),
            balance_usd=last.balance_usd if last else None,
            model_version=last.model_version if last else None,
            data_as_of=last.data_as_of if last else None,
            request_id=last.request_id if last else None,
        )


class TickerHit(BaseModel):
    ticker: str
    company_name: str | None = None
    sector: str | None = None
    asset_type: str | None = None


class TickerSearch(BaseModel):
    """Symbols whose ticker or company name matches the query, best first."""

    query: str
    hits: list[TickerHit]
    charge: Charge

    @classmethod
    def of(cls, query: str, frame: pd.DataFrame, limit: int, charge: Charge) -> TickerSearch:
        rows = frame.head(limit).astype(object).where(frame.head(limit).notna(), None)
        hits = [
            TickerHit(**{k: v for k, v in r.items() if k in TickerHit.model_fields})
            for r in rows.to_dict("records")
        ]
        return cls(query=query, hits=hits, charge=charge)


class HedgeLevel(BaseModel):
    """One level of the cascade: the ETFs that hedge it and the risk each explains."""

    level: str = Field(description="L1 (market), L2 (+ sector) or L3 (+ subsector).")
    hedge_ratios: dict[str, float | None] = Field(
        description="ETF -> hedge ratio: ETF dollars per dollar of the stock (sell that many "
        "dollars of the ETF per dollar held to hedge this level)."
    )
    explained_risk: dict[str, float | None] = Field(
        description="Share of the stock's variance explained by market, sector, subsector, and "
        "the residual left (they sum to 1)."
    )


class RiskSnapshot(BaseModel):
    """A stock's latest risk: volatility, hedge ratios and explained risk per level."""

    ticker: str
    date: str | None = Field(description="The session these values are as of.")
    company_name: str | None = None
    sector: str | None = None
    industry: str | None = None
    levels: list[HedgeLevel]
    recommended_level: str | None = None
    metrics: dict[str, float | None] = Field(description="Every metric the route answers.")
    charge: Charge

    @classmethod
    def of(cls, answer: Mapping[str, Any], charge: Charge) -> RiskSnapshot:
        meta = answer.get("meta") or {}
        hedge_levels = answer.get("hedge_levels") or {}
        levels = []
        for name in ("L1", "L2", "L3"):
            level = hedge_levels.get(name)
            if not isinstance(level, dict):
                continue
            etfs = level.get("hedge_etfs") or {}
            ratios = {
                str(etfs[role]): _number(level.get(f"{role}_hr"))
                for role in ("market", "sector", "subsector")
                if etfs.get(role)
            }
            risk = {
                role: _number(level.get(f"{role}_er"))
                for role in ("market", "sector", "subsector", "residual")
            }
            levels.append(HedgeLevel(level=name, hedge_ratios=ratios, explained_risk=risk))
        return cls(
            ticker=str(answer.get("ticker")),
            date=answer.get("teo"),
            company_name=meta.get("company_name"),
            sector=meta.get("sector"),
            industry=meta.get("industry"),
            levels=levels,
            recommended_level=hedge_levels.get("recommended_level"),
            metrics={k: _number(v) for k, v in (answer.get("metrics") or {}).items()},
            charge=charge,
        )


class EtfTrade(BaseModel):
    etf: str
    exposure: float = Field(description="The book's dollars of exposure to this ETF.")
    trade: float = Field(description="Dollars of the ETF to buy (+) or sell (-) to hedge it.")


class Position(BaseModel):
    ticker: str
    weight: float
    hedge_ratios: dict[str, float | None] = Field(
        description="This level's ETF -> hedge ratio of the position."
    )


class Hedge(BaseModel):
    """The ETF trades that neutralise a book's exposure at one level."""

    level: str
    trades: list[EtfTrade]
    positions: list[Position]
    failed: dict[str, str] = Field(description="Tickers that could not be analysed, and why.")
    charge: Charge

    @classmethod
    def of(cls, book: Portfolio, level: str, charge: Charge) -> Hedge:
        exposure = book.hedge(level)
        trades = [
            EtfTrade(etf=str(etf), exposure=float(v), trade=-float(v))
            for etf, v in exposure.items()
        ]
        pairs = {"L1": ("l1_mkt_hr",), "L2": ("l2_mkt_hr", "l2_sec_hr")}
        fields = pairs.get(level, ("l3_mkt_hr", "l3_sec_hr", "l3_sub_hr"))
        roles = ("market_etf", "sector_etf", "subsector_etf")
        positions = []
        for ticker, row in book.positions.iterrows():
            ratios = {
                str(row[role]): _number(row[f])
                for f, role in zip(fields, roles, strict=False)
                if isinstance(row[role], str)
            }
            positions.append(
                Position(ticker=str(ticker), weight=float(row["weight"]), hedge_ratios=ratios)
            )
        return cls(
            level=level, trades=trades, positions=positions, failed=book.failed, charge=charge
        )


class ReturnsSummary(BaseModel):
    """A stock's daily returns over a period, summarised, with what a hedge would have left."""

    ticker: str
    start: str
    end: str
    sessions: int
    cumulative_return: float | None = Field(description="Compounded daily returns.")
    annualized_volatility: float | None = Field(description="Std of daily returns x sqrt(252).")
    hedged_cumulative_return: float | None = Field(
        description="Compounded L3 residual returns: what the previous day's L3 hedge left."
    )
    hedged_annualized_volatility: float | None
    latest_hedge_ratios: dict[str, float | None] = Field(
        description="The last session's L3 hedge ratios (market, sector, subsector)."
    )
    mean_explained_risk: dict[str, float | None] = Field(
        description="Mean L3 explained-risk shares over the period."
    )
    charge: Charge

    @classmethod
    def of(cls, ticker: str, frame: pd.DataFrame, charge: Charge) -> ReturnsSummary:
        def column_of(name: str) -> pd.Series:
            if name not in frame:
                return pd.Series(dtype=float)
            return frame[name].astype(float).dropna()

        def compounded(name: str) -> float | None:
            values = column_of(name)
            return _number(np.prod(values.to_numpy() + 1.0) - 1.0) if len(values) else None

        def annualized(name: str) -> float | None:
            values = column_of(name)
            return (
                _number(values.std(ddof=1) * math.sqrt(SESSIONS_PER_YEAR))
                if len(values) > 1
                else None
            )

        last = frame.iloc[-1] if len(frame) else pd.Series(dtype=object)
        dates = pd.to_datetime(frame["date"]) if len(frame) else pd.Series(dtype="datetime64[ns]")
        return cls(
            ticker=ticker,
            start=str(dates.min().date()) if len(dates) else "",
            end=str(dates.max().date()) if len(dates) else "",
            sessions=len(frame),
            cumulative_return=compounded("returns_gross"),
            annualized_volatility=annualized("returns_gross"),
            hedged_cumulative_return=compounded("l3_rr"),
            hedged_annualized_volatility=annualized("l3_rr"),
            latest_hedge_ratios={
                k: _number(last.get(f"l3_{SHORT[k]}_hr")) for k in ("market", "sector", "subsector")
            },
            mean_explained_risk={
                k: _number(frame[f"l3_{v}_er"].mean()) if f"l3_{v}_er" in frame else None
                for k, v in SHORT.items()
            },
            charge=charge,
        )


class CostEstimate(BaseModel):
    """What a call would cost now (nothing is charged for asking)."""

    endpoint: str
    estimated_cost_usd: float
    estimated_tokens: int | None = None
    estimated_rows: int | None = None
    pricing_model: str | None = None
    note: str | None = None
    charge: Charge

    @classmethod
    def of(cls, answer: Mapping[str, Any], charge: Charge) -> CostEstimate:
        fields = {k: answer.get(k) for k in cls.model_fields if k != "charge"}
        return cls(**fields, charge=charge)


class RiskContribution(BaseModel):
    name: str = Field(description="A level, an ETF factor or a ticker.")
    contribution: float = Field(description="Its Euler contribution to the daily volatility.")
    share: float = Field(description="contribution / volatility (they sum to 1).")


class HedgeTrade(BaseModel):
    etf: str
    notional: float = Field(description="To buy (+) or sell (-), in the positions' units.")
    tradable: bool


class PortfolioRiskResult(BaseModel):
    """A book's predicted risk, where it comes from, and what the ETF hedge leaves."""

    date: str = Field(description="The session of the forecast (data up to the one before).")
    vol_daily: float = Field(description="Predicted daily volatility, positions' units.")
    vol_annual: float
    factor_vol_daily: float
    style_vol_daily: float = Field(
        0.0, description="The style factors' part (the risk the ETF hedge does not remove)."
    )
    specific_vol_daily: float
    tracking_error_daily: float | None = Field(
        description="Predicted daily volatility of the book less the benchmark, if given."
    )
    by_level: list[RiskContribution]
    by_factor: list[RiskContribution]
    by_position: list[RiskContribution]
    hedge: list[HedgeTrade]
    vol_after_hedge_daily: float
    after_hedge: list[RiskContribution] = Field(
        default_factory=list,
        description="vol_after_hedge_daily split by level: the style and specific risk the "
        "ETF hedge leaves.",
    )
    unused: dict[str, str] = Field(description="Tickers the model could not use, and why.")
    notes: list[str] = Field(
        description="What the figures leave out (an ETF that is not a factor of the model is "
        "modelled on the market factor alone)."
    )
    charge: Charge

    @classmethod
    def of(cls, doc: dict[str, Any], charge: Charge) -> PortfolioRiskResult:
        p = doc["portfolio"]
        te = doc.get("tracking_error")
        return cls(
            date=doc["date"],
            vol_daily=p["vol_daily"],
            vol_annual=p["vol_annual"],
            factor_vol_daily=p["factor_vol_daily"],
            style_vol_daily=p.get("style_vol_daily", 0.0),
            specific_vol_daily=p["specific_vol_daily"],
            tracking_error_daily=None if te is None else te["vol_daily"],
            by_level=[
                RiskContribution(
                    name=k, contribution=v, share=v / p["vol_daily"] if p["vol_daily"] else 0.0
                )
                for k, v in p["by_level"].items()
            ],
            by_factor=[
                RiskContribution(name=f["factor"], contribution=f["contribution"], share=f["share"])
                for f in p["factors"]
            ],
            by_position=[
                RiskContribution(name=x["ticker"], contribution=x["contribution"], share=x["share"])
                for x in p["positions"]
            ],
            hedge=[
                HedgeTrade(etf=leg["etf"], notional=leg["notional"], tradable=leg["tradable"])
                for leg in doc["hedge"]["legs"]
            ],
            vol_after_hedge_daily=doc["hedge"]["vol_after_daily"],
            after_hedge=[
                RiskContribution(
                    name=k,
                    contribution=v,
                    share=v / doc["hedge"]["vol_after_daily"]
                    if doc["hedge"]["vol_after_daily"]
                    else 0.0,
                )
                for k, v in doc["hedge"].get("after", {}).items()
            ],
            unused={u["ticker"]: u["reason"] for u in doc["unused"]},
            notes=list(doc.get("notes", [])),
            charge=charge,
        )


class Layer(BaseModel):
    layer: str = Field(description="market, sector, subsector or residual.")
    explained_risk: float | None = Field(description="Share of the stock's variance (0 to 1).")
    hedge_ratio: float | None = Field(description="Dollars of the ETF per $1 of stock.")
    hedge_etf: str | None = Field(description="The ETF that hedges this layer.")


class Decomposition(BaseModel):
    """A stock's four bets: market, sector, subsector and its own (residual) risk."""

    ticker: str
    date: str | None = Field(description="The session of these values.")
    layers: list[Layer]
    hedge: dict[str, float] = Field(description="ETF -> dollars to hold per $1 of stock.")
    charge: Charge

    @classmethod
    def of(cls, answer: Mapping[str, Any], charge: Charge) -> Decomposition:
        exposure = answer.get("exposure") or {}
        layers = [
            Layer(
                layer=name,
                explained_risk=_number(block.get("er")),
                hedge_ratio=_number(block.get("hr")),
                hedge_etf=block.get("hedge_etf"),
            )
            for name, block in exposure.items()
        ]
        teo = answer.get("teo")
        return cls(
            ticker=str(answer.get("ticker")),
            date=str(teo) if teo is not None else None,
            layers=layers,
            hedge={k: float(v) for k, v in (answer.get("hedge") or {}).items()},
            charge=charge,
        )


class FactorValue(BaseModel):
    factor: str = Field(description="The macro or style factor key, e.g. credit, momentum.")
    correlation: float | None = Field(
        description="Correlation of the stock's returns with the factor's (-1 to 1); null when "
        "the data set lacks the factor's ETF or they overlap under 30 sessions."
    )
    etf: str | None = Field(description="The ETF whose returns stand for the factor.")
    proxy_for: str | None = Field(
        description="The ETF the real Service B reads, where `etf` is a proxy for it."
    )


class FactorCorrelation(BaseModel):
    """A stock's correlations with macro and style factors."""

    ticker: str
    return_type: str = Field(description="gross, l1, l2 or l3_residual returns of the stock.")
    method: str = Field(description="pearson or spearman.")
    window_days: int = Field(description="The most paired sessions used per factor.")
    overlap_days: int = Field(description="Paired sessions behind the best-covered factor.")
    factors: list[FactorValue]
    warnings: list[str] = Field(description="Factors dropped, missing or served by a proxy.")
    charge: Charge

    @classmethod
    def of(cls, answer: Mapping[str, Any], charge: Charge) -> FactorCorrelation:
        sources = answer.get("sources") or {}
        return cls(
            ticker=str(answer.get("ticker")),
            return_type=str(answer.get("return_type")),
            method=str(answer.get("method")),
            window_days=int(answer.get("window_days") or 0),
            overlap_days=int(answer.get("overlap_days") or 0),
            factors=[
                FactorValue(
                    factor=key,
                    correlation=_number(value),
                    etf=(sources.get(key) or {}).get("etf"),
                    proxy_for=(sources.get(key) or {}).get("proxy_for"),
                )
                for key, value in (answer.get("correlations") or {}).items()
            ],
            warnings=[str(w) for w in answer.get("warnings") or []],
            charge=charge,
        )


class Rank(BaseModel):
    metric: str
    cohort: str = Field(description="universe, sector or subsector: whom it is ranked among.")
    window: str = Field(description="1d, 21d, 63d or 252d.")
    rank: int | None = Field(description="1 is the largest value of the cohort.")
    cohort_size: int | None
    percentile: float | None = Field(description="100 for the first, down to 100/cohort_size.")
    value: float | None = Field(description="The metric's value for this stock.")


class Rankings(BaseModel):
    """A stock's ranks in its cohorts on the latest session."""

    ticker: str
    date: str | None = Field(description="The session ranked; null: not in the universe then.")
    ranks: list[Rank]
    charge: Charge

    @classmethod
    def of(cls, frame: pd.DataFrame, charge: Charge) -> Rankings:
        teo = frame.attrs.get("teo")
        return cls(
            ticker=str(frame.attrs.get("ticker")),
            date=str(teo) if teo is not None else None,
            ranks=[
                Rank(
                    metric=str(r["metric"]),
                    cohort=str(r["cohort"]),
                    window=str(r["window"]),
                    rank=_integer(r.get("rank_ordinal")),
                    cohort_size=_integer(r.get("cohort_size")),
                    percentile=_number(r.get("rank_percentile")),
                    value=_number(r.get("value")),
                )
                for r in frame.to_dict("records")
            ],
            charge=charge,
        )


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None
