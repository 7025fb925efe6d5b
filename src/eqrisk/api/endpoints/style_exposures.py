"""`GET /api/style-exposures`: the style exposures of the universe on a session (the risk
model's second layer: size, momentum, beta, residual volatility, liquidity, reversal and the
residual market), with that session's cross-sectional regression (factor returns, t-statistics,
R^2); docs/decisions/risk-forecast.md."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from starlette.responses import Response

from eqrisk.api.answers import document, snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.formats import JSON, render, rows_of
from eqrisk.api.models import SERIES_RESPONSES, Enveloped
from eqrisk.api.params import FORMAT_DESCRIPTION, FORMATS, Format, IsoDate, VersionedParams
from eqrisk.api.risk_answers import DATE_DESCRIPTION, risk_session, session_date
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.risk_days import risk_day
from eqrisk.snapshot.risk_layer import is_next, read_chunked
from eqrisk.snapshot.versions import Snapshot


class StyleExposuresParams(VersionedParams):
    date: IsoDate | None = Field(None, description=DATE_DESCRIPTION)
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


class StyleFactor(BaseModel):
    factor: str
    description: str
    factor_return: float | None = Field(
        description="The session's factor return (null: not estimated, or the next session)."
    )
    t_stat: float | None = Field(description="Its t-statistic in the regression.")
    forecast: bool = Field(
        description="Whether the factor has a risk forecast this session: false, it is left out "
        "of /api/factor-covariance, /api/specific-risk and the portfolio's risk that session "
        "and its exposures here are 0 (its signal share is below 1%, or too few returns yet)."
    )


class StyleExposuresResponse(Enveloped):
    date: str
    factors: list[StyleFactor]
    r2: float | None = Field(description="The regression's R^2 (weights sqrt(cap)).")
    regression_stocks: int = Field(description="Stocks in the session's regression.")
    data: list[dict[str, Any]] = Field(
        description="A row per stock in the layer: ticker, then its exposure to each factor."
    )


@dataclass(frozen=True)
class StylePlan:
    t: int
    date: str
    rows: np.ndarray  # the stocks in the layer that session
    factors: list[str]


def plan_styles(snap: Snapshot, p: StyleExposuresParams) -> StylePlan:
    t = risk_session(snap, p.date)
    block = snap.manifest["risk"]
    if not block.get("styles"):
        raise ApiError(
            "NO_DATA",
            f"snapshot {snap.version} holds no style factors (a data set without market caps, "
            "or built before them)",
            missing="styles",
        )
    day = risk_day(snap, t)
    assert day.style is not None
    rows = np.flatnonzero((day.style != 0.0).any(axis=1))
    return StylePlan(t, session_date(snap, t), rows, list(block["styles"]["names"]))


def size(plan: StylePlan, p: StyleExposuresParams) -> Size:
    n = len(plan.rows)
    return Size(1, n, approx_bytes(n, len(plan.factors) + 1, p.format or "json", 5))


def _value(x: float) -> float | None:
    return None if x != x else float(x)


def render_styles(call: Call[StyleExposuresParams, StylePlan]) -> Response:
    """The stocks' style exposures on the session: JSON `{date, factors, r2,
    regression_stocks, data}`; CSV / Parquet a row per stock (ticker, then a column per
    factor)."""
    snap, plan = call.snap, call.plan
    day = risk_day(snap, plan.t)
    assert day.style is not None
    cols: dict[str, Any] = {"ticker": [str(s) for s in day.symbols[plan.rows].tolist()]}
    for j, name in enumerate(plan.factors):
        cols[name] = np.ascontiguousarray(day.style[plan.rows, j])
    if call.fmt != JSON:
        return render(
            call.fmt,
            cols,
            envelope={"_metadata": snap.metadata(), "csv_comment": False},
            headers=snap_headers(snap),
            filename=f"style-exposures_{plan.date}",
        )
    text = snap.manifest["risk"]["styles"]["text"]
    k = len(plan.factors)
    if is_next(snap.manifest, plan.t):  # no regression yet: the session has not happened
        ret, tstat, fit = np.full(k, np.nan), np.full(k, np.nan), np.array([np.nan, 0.0])
    else:
        ret = read_chunked(snap.path, snap.manifest, "sret", plan.t)
        tstat = read_chunked(snap.path, snap.manifest, "stat", plan.t)
        fit = read_chunked(snap.path, snap.manifest, "sfit", plan.t)
    served = dict(zip(day.factor_keys, day.served.tolist(), strict=True))
    factors = [
        {
            "factor": name,
            "description": text.get(name, ""),
            "factor_return": _value(float(ret[j])),
            "t_stat": _value(float(tstat[j])),
            "forecast": served[name],
        }
        for j, name in enumerate(plan.factors)
    ]
    return document(
        snap,
        {
            "date": plan.date,
            "factors": factors,
            "r2": _value(float(fit[0])),
            "regression_stocks": int(fit[1]),
            "data": rows_of(cols),
        },
    )


ENDPOINT = Endpoint(
    path="/api/style-exposures",
    service="risk",
    price_key="style-exposures",
    params=StyleExposuresParams,
    plan=plan_styles,
    size=size,
    formats=FORMATS,
    render=render_styles,
    threaded=True,
    doc=Doc(
        name="style_exposures",
        summary="The style exposures of the universe on a session (the second factor layer)",
        description=(
            "A row per stock in the risk model's second layer: its exposure to each style "
            "factor (standardised across the universe: cap-weighted mean 0, standard deviation "
            "1; the descriptors of the close before the session), and per factor its return "
            "and t-statistic in the session's cross-sectional regression of the residuals the "
            "ETF layer leaves, with the regression's R^2. With /api/factor-covariance (the "
            "style rows of F) and /api/specific-risk it gives Sigma over both layers. JSON, "
            "CSV or Parquet (a row per stock)."
        ),
        response_model=StyleExposuresResponse,
        responses=SERIES_RESPONSES,
    ),
)
