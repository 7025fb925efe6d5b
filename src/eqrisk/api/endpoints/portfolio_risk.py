"""`POST /api/portfolio/risk`: a portfolio's predicted volatility, tracking error, Euler
contributions per level, factor and position, and its ETF hedge, from the snapshot's risk model
(docs/decisions/portfolio-risk.md). Priced per position used."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator
from starlette.responses import Response

from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import BODY_ERRORS, ERRORS
from eqrisk.api.params import BodyParams, IsoDate
from eqrisk.api.risk_answers import (
    DATE_DESCRIPTION,
    PortfolioRiskResponse,
    risk_session,
    session_date,
)
from eqrisk.api.sizes import Size
from eqrisk.snapshot.portfolio import (
    ANNUAL,
    PortfolioAnswer,
    attribution_dict,
    portfolio_answer,
    unusable_list,
)
from eqrisk.snapshot.versions import Snapshot

MAX_POSITIONS = 5000
LEVELS = {"L1": 1, "L2": 2, "L3": 3}


class PortfolioRiskParams(BodyParams):
    positions: dict[str, float] = Field(
        min_length=1,
        max_length=MAX_POSITIONS,
        description=(
            f"Ticker -> position (1 to {MAX_POSITIONS}), as weights or dollars (see `units`); "
            "shorts are negative. Tickers are case-insensitive; the same ticker twice adds up."
        ),
        examples=[{"AAPL": 0.4, "MSFT": 0.35, "XOM": -0.25}],
    )
    units: Literal["weights", "dollars"] = Field(
        "weights",
        description="What the positions are; every figure of the answer is in their units.",
    )
    benchmark: str | dict[str, float] | None = Field(
        None,
        description=(
            "Optional benchmark for the tracking error: a ticker (for example SPY, held for "
            "the net value of the positions used) or positions in the same units."
        ),
        examples=["SPY"],
    )
    date: IsoDate | None = Field(None, description=DATE_DESCRIPTION)
    level: Literal["L1", "L2", "L3"] = Field(
        "L3", description="Level of the ETF hedge: L1 market, L2 + sector, L3 + subsector."
    )

    @field_validator("positions")
    @classmethod
    def _upper(cls, value: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for ticker, w in value.items():
            key = ticker.strip().upper()
            if not key or len(key) > 32:
                raise ValueError(f"{ticker!r} is not a ticker")
            out[key] = out.get(key, 0.0) + float(w)
        return out

    @field_validator("benchmark")
    @classmethod
    def _bench(cls, value: str | dict[str, float] | None) -> str | dict[str, float] | None:
        if isinstance(value, str):
            key = value.strip().upper()
            if not key or len(key) > 32:
                raise ValueError(f"{value!r} is not a ticker")
            return key
        if isinstance(value, dict):
            return cls._upper(value)
        return value


@dataclass(frozen=True)
class PortfolioPlan:
    answer: PortfolioAnswer
    date: str
    used: int


def asked_tickers(p: PortfolioRiskParams) -> list[str]:
    """The tickers the request names (the demo key's first rule)."""
    bench = [p.benchmark] if isinstance(p.benchmark, str) else list(p.benchmark or {})
    return [*p.positions, *bench]


def plan_portfolio(snap: Snapshot, p: PortfolioRiskParams) -> PortfolioPlan:
    t = risk_session(snap, p.date)
    benchmark: dict[str, float] | None = None
    if isinstance(p.benchmark, dict):
        benchmark = p.benchmark
    first = portfolio_answer(snap, t, p.positions, hedge_level=LEVELS[p.level])
    used = first.risk.portfolio.positions
    if not used.tickers:
        why = "; ".join(f"{u.ticker}: {u.reason}" for u in first.risk.unusable[:10])
        raise ApiError(
            "NO_DATA",
            f"no position has a risk forecast on {session_date(snap, t)} ({why})",
            unused=[u.ticker for u in first.risk.unusable],
        )
    if isinstance(p.benchmark, str):
        benchmark = {p.benchmark: float(used.weights.sum())}
    answer = first
    if benchmark is not None:
        answer = portfolio_answer(
            snap, t, p.positions, benchmark=benchmark, hedge_level=LEVELS[p.level]
        )
    return PortfolioPlan(answer, session_date(snap, t), len(used.tickers))


def size(plan: PortfolioPlan, p: PortfolioRiskParams) -> Size:
    """One unit per position used (a position the model cannot use is not charged)."""
    rows = plan.used
    note = f"charged per position used: {rows} of {len(p.positions)}"
    return Size(rows, rows, 1500 + rows * 260, note)


def served(plan: PortfolioPlan) -> list[str]:
    risk = plan.answer.risk
    return [*risk.portfolio.positions.tickers, *plan.answer.hedge.keys]


def render(call: Call[PortfolioRiskParams, PortfolioPlan]) -> Response:
    """The portfolio's risk (see the route's description)."""
    a, p = call.plan.answer, call.params
    risk, hedge = a.risk, a.hedge
    legs = [
        {"etf": k, "notional": n, "tradable": ok, "exposure_after": x}
        for k, n, ok, x in zip(
            hedge.keys, hedge.notional, hedge.tradable, hedge.exposure_after, strict=True
        )
    ]
    doc = {
        "date": call.plan.date,
        "units": p.units,
        "portfolio": attribution_dict(risk.portfolio),
        "tracking_error": None if risk.active is None else attribution_dict(risk.active),
        "hedge": {
            "level": p.level,
            "legs": legs,
            "vol_after_daily": hedge.vol_after,
            "vol_after_annual": hedge.vol_after * ANNUAL,
        },
        "unused": unusable_list(risk.unusable),
        "benchmark_unused": unusable_list(risk.benchmark_unusable),
    }
    return document(call.snap, doc)


ENDPOINT = Endpoint(
    path="/api/portfolio/risk",
    method="POST",
    service="risk",
    price_key="portfolio/risk",
    params=PortfolioRiskParams,
    plan=plan_portfolio,
    size=size,
    asked=asked_tickers,
    tickers=served,
    render=render,
    threaded=True,
    doc=Doc(
        name="portfolio_risk",
        summary="A portfolio's predicted risk, its attribution and its ETF hedge",
        description=(
            "From the snapshot's risk model of the session (Sigma = H F H' + D, forecast from "
            "data up to the session before): predicted volatility daily and annualised, its "
            "factor / specific split, Euler contributions that add up to it per level (market, "
            "sector, subsector, specific), per ETF factor and per position (marginal, "
            "contribution, share); with `benchmark`, the same for positions less the benchmark "
            "(its vol is the tracking error); the ETF hedge at `level` (notionals to buy, "
            "negative to sell) with the volatility left after it; the tickers not used, with "
            "why. Charged per position used (see /api/estimate)."
        ),
        response_model=PortfolioRiskResponse,
        responses={**ERRORS, **BODY_ERRORS},
    ),
)
