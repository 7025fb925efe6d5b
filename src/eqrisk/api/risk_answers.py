"""What the risk-model routes share (`/api/portfolio/risk`, `/api/factor-covariance`,
`/api/specific-risk`): the session a `date` names, and the response models of their JSON."""

# No `from __future__ import annotations`: pydantic reads these annotations.

from datetime import date

import numpy as np
from pydantic import BaseModel, Field

from eqrisk.api.errors import ApiError
from eqrisk.api.models import Enveloped
from eqrisk.snapshot.portfolio import LOW_USED_SHARE
from eqrisk.snapshot.versions import Snapshot

DATE_DESCRIPTION = (
    "The session of the forecast (YYYY-MM-DD): the last session on or before it that the "
    "snapshot holds, or the session after its last close (on or after that date); default that "
    "next session, forecast from data through the last close. The forecast of a session uses "
    "data up to the session before it."
)


def risk_session(snap: Snapshot, when: date | None) -> int:
    """The session index `when` names (the last one on or before it), or a 400 / 404."""
    if "risk" not in snap.manifest:
        raise ApiError(
            "NO_DATA",
            f"snapshot {snap.version} was built without the risk model; run eqrisk build",
            missing="risk",
        )
    sessions = snap.sessions
    ahead = snap.manifest["risk"].get("next")
    if ahead is not None and (when is None or np.datetime64(when, "D") >= np.datetime64(ahead)):
        return len(sessions)  # the next session: F, H, D from data through the last close
    if when is None:
        return len(sessions) - 1
    t = int(np.searchsorted(sessions, np.datetime64(when, "D"), side="right")) - 1
    if t < 0:
        raise ApiError(
            "INVALID_PARAMETER",
            f"date={when} is before the first session the snapshot holds ({sessions[0]})",
            parameter="date",
        )
    return t


def session_date(snap: Snapshot, t: int) -> str:
    if t == len(snap.sessions):
        return str(snap.manifest["risk"]["next"])
    return str(np.datetime64(snap.sessions[t], "D"))


class FactorRisk(BaseModel):
    factor: str = Field(description="Factor key: an ETF symbol or group:<level>:<name>.")
    level: str = Field(description="market, sector, subsector or style (the second layer).")
    exposure: float = Field(description="The positions' exposure x_k = sum_i w_i h_ik.")
    marginal: float = Field(description="d vol / d x_k = (F x)_k / vol.")
    contribution: float = Field(description="x_k (F x)_k / vol: Euler contribution to vol.")
    share: float = Field(description="contribution / vol.")


class PositionRisk(BaseModel):
    ticker: str
    position: float = Field(description="The position as given (weight or dollars).")
    marginal: float = Field(description="d vol / d w_i.")
    contribution: float = Field(description="w_i d vol / d w_i; they add up to vol.")
    share: float = Field(description="contribution / vol.")
    model_level: int = Field(
        description="The deepest level of the model's exposures the position has: 1 market "
        "(a factor, or an ETF that is not one), 2 + sector (a stock without a subsector ETF), "
        "3 + subsector."
    )
    model: str = Field(description="What model_level models the position on, in words.")


class RiskBreakdown(BaseModel):
    vol_daily: float = Field(description="Predicted daily volatility (units of the positions).")
    vol_annual: float = Field(description="vol_daily x sqrt(252).")
    factor_vol_daily: float = Field(description="sqrt(x'Fx): the factors' part (both layers).")
    style_vol_daily: float = Field(
        description="sqrt(x_s' F_ss x_s): the second layer's style factors alone."
    )
    specific_vol_daily: float = Field(description="sqrt(sum w_i^2 D_i): the specific part.")
    by_level: dict[str, float] = Field(
        description="Euler contributions to vol_daily of market, sector, subsector, style "
        "(the second layer), specific."
    )
    factors: list[FactorRisk]
    positions: list[PositionRisk]


class HedgeLeg(BaseModel):
    etf: str
    notional: float = Field(description="To buy (negative: sell), units of the positions.")
    tradable: bool = Field(description="False for a group portfolio (no ETF in the data).")
    exposure_after: float = Field(description="Factor exposure left after the tradable legs.")


class StyleLeg(BaseModel):
    etf: str
    notional: float = Field(description="To buy (negative: sell), units of the positions.")
    loadings: dict[str, float] = Field(
        description="The ETF's style loadings: slopes of its specific return on the style "
        "factors' returns over the 252 sessions before the date."
    )


class StyleNeutralHedge(BaseModel):
    legs: list[StyleLeg] = Field(description="Factor-ETF legs (empty: none in the data).")
    etf_legs: list[HedgeLeg] = Field(description="The ETF hedge of the book with those legs.")
    style_exposure_before: dict[str, float]
    style_exposure_after: dict[str, float] = Field(
        description="The style exposure the book keeps with both kinds of legs."
    )
    vol_after_daily: float
    vol_after_annual: float
    after: dict[str, float] = Field(description="vol_after_daily split by level.")


class PortfolioHedge(BaseModel):
    level: str
    legs: list[HedgeLeg]
    vol_after_daily: float = Field(
        description="The volatility the ETF legs leave: the style risk (the ETFs do not "
        "remove it), the specific risk and any factor the legs do not reach."
    )
    vol_after_annual: float
    after: dict[str, float] = Field(
        description="vol_after_daily split by level (Euler contributions that add up to it): "
        "market, sector, subsector, style, specific."
    )
    style_neutral: StyleNeutralHedge | None = Field(
        None, description="With `style_neutral: true`: the style-neutral hedge (absent else)."
    )


class Unused(BaseModel):
    ticker: str
    reason: str


class PortfolioRiskResponse(Enveloped):
    date: str
    units: str
    portfolio: RiskBreakdown
    tracking_error: RiskBreakdown | None = Field(
        description="The same for positions less the benchmark: its vol is the tracking error."
    )
    hedge: PortfolioHedge
    unused: list[Unused]
    benchmark_unused: list[Unused]
    used_share: float = Field(
        description="The share of the book the answer covers: sum |position| of the positions "
        "used over sum |position| of all given (1.0: every position used)."
    )
    partial: bool = Field(
        description=f"True when used_share is below {LOW_USED_SHARE}: the figures describe "
        "part of the book only (see `unused` for the rest)."
    )
    notes: list[str] = Field(
        description="What the figures leave out: a position that is neither a stock nor a "
        "factor of the model (an ETF such as QQQ, TLT, GLD) is modelled on the market factor "
        "alone, its other content counted as specific risk."
    )


class FactorCovarianceResponse(Enveloped):
    date: str
    factors: list[str]
    levels: list[str | None]
    matrix: list[list[float | None]] = Field(
        description="F (K x K), daily; null for an ETF factor with too few returns yet "
        "(a style factor without a forecast that session is not listed)."
    )


class SpecificRiskRow(BaseModel):
    ticker: str
    level: int = Field(description="Hedge level of the exposures (0: none that session).")
    market_factor: str | None
    market_exposure: float | None
    sector_factor: str | None
    sector_exposure: float | None
    subsector_factor: str | None
    subsector_exposure: float | None
    specific_var: float | None = Field(description="D_i: specific variance, daily.")
    risk_total_vol: float | None
    risk_factor_vol: float | None
    risk_specific_vol: float | None
    model_config = {"extra": "allow"}  # style_<factor>: the second layer's exposures


class SpecificRiskResponse(Enveloped):
    date: str
    data: list[SpecificRiskRow]
