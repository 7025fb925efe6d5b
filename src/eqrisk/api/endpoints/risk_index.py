"""`POST /api/portfolio/risk-index`: the real Service B's portfolio risk index, in its shape, with
eqrisk's own numbers: the volatility is the risk model's forecast sqrt(w' Sigma w), Sigma = H F
H' + D (`snapshot.portfolio`), not the vendor's weighted average of the positions' 23-day
volatilities, and the variance split is its Euler split (docs/decisions/drop-in-routes.md)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from eqrisk.api import wire
from eqrisk.api.answers import document
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import BODY_ERRORS, ERRORS
from eqrisk.api.params import BodyParams, Ticker, VersionedParams
from eqrisk.api.plans import resolve
from eqrisk.api.risk_answers import risk_session, session_date
from eqrisk.api.sizes import Size
from eqrisk.snapshot.portfolio import PortfolioAnswer, portfolio_answer
from eqrisk.snapshot.versions import Snapshot

MAX_INDEX_POSITIONS, MAX_INDEX_YEARS = 100, 15
LAYERS = {"market": "l3_mkt_er", "sector": "l3_sec_er", "subsector": "l3_sub_er"}


class Position(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ticker: Ticker = Field(description="Ticker, case-insensitive.")
    weight: float = Field(gt=0, allow_inf_nan=False, description="A fraction or dollars (> 0).")


class RiskIndexParams(BodyParams, VersionedParams):
    positions: list[Position] = Field(
        max_length=MAX_INDEX_POSITIONS,
        description=(
            f"0 to {MAX_INDEX_POSITIONS} `{{ticker, weight}}`, weights > 0 as fractions or "
            "dollars (normalised to sum to 1; the same ticker twice adds up). Empty: a 200 "
            '`status: "syncing"`, not charged.'
        ),
    )
    timeSeries: bool = Field(
        False, description="true: add `time_series`, the weighted L3 shares per session."
    )
    years: int = Field(
        1, ge=1, le=MAX_INDEX_YEARS, description="Years of `time_series` (with timeSeries)."
    )


@dataclass(frozen=True)
class IndexPlan:
    weights: dict[str, float]  # served ticker -> normalised weight, of the resolved positions
    errors: list[dict[str, str]]
    answer: PortfolioAnswer | None  # None: no position
    t: int


def plan_index(snap: Snapshot, p: RiskIndexParams) -> IndexPlan:
    t = risk_session(snap, None)
    if not p.positions:
        return IndexPlan({}, [], None, t)
    asked: dict[str, float] = {}
    for pos in p.positions:
        asked[pos.ticker] = asked.get(pos.ticker, 0.0) + pos.weight
    errors: list[dict[str, str]] = []
    found: dict[str, float] = {}
    for ticker, w in asked.items():
        sym = resolve(snap.index, ticker)
        if sym is None:
            errors.append({"ticker": ticker, "error": "not in the served universe"})
        else:
            found[sym.ticker] = found.get(sym.ticker, 0.0) + w
    total = sum(found.values())
    weights = {k: w / total for k, w in found.items()} if total > 0 else {}
    answer = portfolio_answer(snap, t, weights) if weights else None
    if answer is not None:
        errors += [{"ticker": u.ticker, "error": u.reason} for u in answer.risk.unusable]
        used = answer.risk.portfolio.positions.tickers
        if not used:
            raise ApiError(
                "NO_DATA",
                f"no position has a risk forecast on {session_date(snap, t)}",
                errors=errors,
            )
        kept = {k: weights[k] for k in used}
        norm = sum(kept.values())
        weights = {k: w / norm for k, w in kept.items()}
        answer = portfolio_answer(snap, t, weights)  # renormalised over the resolved ones
    return IndexPlan(weights, errors, answer, t)


def size(plan: IndexPlan, p: RiskIndexParams) -> Size:
    n = len(plan.weights)
    if n == 0:
        return Size(0, 0, 300, "no position: not charged")
    return Size(1, n, 1200 + 260 * n)


def _shares(by_level: dict[str, float], vol: float) -> dict[str, float]:
    """Euler contributions to vol as shares of variance (they sum to 1)."""
    out = {k: by_level.get(k, 0.0) / vol for k in ("market", "sector", "subsector", "style")}
    out["residual"] = by_level.get("specific", 0.0) / vol
    out["systematic"] = out["market"] + out["sector"] + out["subsector"] + out["style"]
    return out


def time_series(snap: Snapshot, weights: dict[str, float], years: int) -> list[dict[str, Any]]:
    """Per session of the last `years` years: the holdings-weighted L3 shares (the vendor's
    definition), over the positions with shares that session."""
    idx = snap.index
    lo, hi, _, _ = idx.window(min(years, idx.max_years))
    syms = [idx.symbols[k] for k in weights]
    w = np.array([weights[s.ticker] for s in syms])
    cols: dict[str, np.ndarray] = {}
    for name, field in {**LAYERS, "residual": "l3_res_er"}.items():
        block = np.vstack([np.asarray(snap.array(field)[s.row, lo:hi]) for s in syms])
        cols[name] = block
    has = np.isfinite(cols["market"]) & np.isfinite(cols["residual"])
    norm = (w[:, None] * has).sum(axis=0)
    rows: list[dict[str, Any]] = []
    for j, day in enumerate(idx.day[lo:hi].tolist()):
        if norm[j] <= 0:
            continue
        share = {
            k: float(np.nansum(w * np.where(has[:, j], v[:, j], np.nan)) / norm[j])
            for k, v in cols.items()
        }
        rows.append(
            {
                "date": day,
                "market_er": share["market"],
                "sector_er": share["sector"],
                "subsector_er": share["subsector"],
                "residual_er": share["residual"],
                "systematic_er": share["market"] + share["sector"] + share["subsector"],
            }
        )
    return rows


def render(call: Call[RiskIndexParams, IndexPlan]) -> Response:
    snap, plan, p = call.snap, call.plan, call.params
    if plan.answer is None:
        return document(
            snap,
            {
                "status": "syncing",
                "message": "no positions: send positions [{ticker, weight}, ...]",
                "summary": {"total_positions": 0, "resolved": 0, "errors": 0},
            },
        )
    risk = plan.answer.risk.portfolio
    contributions = dict(zip(risk.positions.tickers, risk.positions.share.tolist(), strict=True))
    per_ticker: dict[str, Any] = {}
    weighted_vol = 0.0
    for ticker, w in plan.weights.items():
        values = wire.latest_values(snap, snap.index.symbols[ticker])
        vol = values.get("vol_23d")
        weighted_vol += w * (vol or 0.0)
        per_ticker[ticker] = {
            "weight": w,
            "vol_23d": vol,
            **{f"l3_{k}_er": values[f] for k, f in {**LAYERS, "residual": "l3_res_er"}.items()},
            "risk_share": contributions.get(ticker),
        }
    index = {
        "variance_decomposition": _shares(dict(risk.by_level), risk.vol),
        "portfolio_volatility_23d": risk.vol_annual,
        "position_count": len(plan.weights),
        "volatility_method": (
            "forecast: sqrt(w' Sigma w) of eqrisk's risk model (Sigma = H F H' + D), "
            "annualised; not a weighted average of the positions' volatilities"
        ),
        "weighted_average_vol_23d": weighted_vol,
        "forecast_session": session_date(snap, plan.t),
    }
    doc: dict[str, Any] = {
        "portfolio_risk_index": index,
        "per_ticker": per_ticker,
        "summary": {
            "total_positions": len(plan.weights) + len(plan.errors),
            "resolved": len(plan.weights),
            "errors": len(plan.errors),
        },
        "errors": plan.errors,
    }
    if p.timeSeries:
        doc["time_series"] = time_series(snap, plan.weights, p.years)
    return document(snap, doc)


ENDPOINT = Endpoint(
    path="/api/portfolio/risk-index",
    method="POST",
    service="risk",
    price_key="portfolio/risk-index",
    params=RiskIndexParams,
    plan=plan_index,
    size=size,
    asked=lambda p: [pos.ticker for pos in p.positions],
    tickers=lambda plan: tuple(plan.weights),
    render=render,
    threaded=True,
    doc=Doc(
        name="portfolio_risk_index",
        summary="Portfolio risk index (the real Service B's shape, eqrisk's forecast)",
        description=(
            "`portfolio_risk_index.portfolio_volatility_23d` is eqrisk's forecast of the "
            "portfolio's annualised volatility, sqrt(w' Sigma w) with Sigma = H F H' + D, not "
            "the vendor's weighted average of 23-day volatilities (that average is beside it, "
            "`weighted_average_vol_23d`); `variance_decomposition` is the forecast's Euler split "
            "(market, sector, subsector, residual, systematic; sums to 1). `per_ticker`, "
            "`summary`, `errors` (unknown or unusable tickers; the rest is renormalised), and "
            "with `timeSeries` the holdings-weighted L3 shares per session."
        ),
        responses={**ERRORS, **BODY_ERRORS},
    ),
)
