"""`GET /api/factor-covariance`: the risk model's factor covariance F of a session (the ETF and
group factors, K x K, daily), for users who feed an optimiser."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import document, snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.formats import JSON, render
from eqrisk.api.models import SERIES_RESPONSES
from eqrisk.api.params import FORMAT_DESCRIPTION, FORMATS, Format, IsoDate, VersionedParams
from eqrisk.api.risk_answers import (
    DATE_DESCRIPTION,
    FactorCovarianceResponse,
    risk_session,
    session_date,
)
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.risk_arrays import FactorCovarianceDay
from eqrisk.snapshot.risk_days import served_covariance
from eqrisk.snapshot.versions import Snapshot


class FactorCovarianceParams(VersionedParams):
    date: IsoDate | None = Field(None, description=DATE_DESCRIPTION)
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


@dataclass(frozen=True)
class CovariancePlan:
    day: FactorCovarianceDay
    date: str


def plan_cov(snap: Snapshot, p: FactorCovarianceParams) -> CovariancePlan:
    t = risk_session(snap, p.date)
    return CovariancePlan(served_covariance(snap, t), session_date(snap, t))


def size(plan: CovariancePlan, p: FactorCovarianceParams) -> Size:
    k = len(plan.day.keys)
    return Size(1, k, approx_bytes(k, k, p.format or "json", 2))


def _listed(row: np.ndarray) -> list[float | None]:
    return [None if v != v else float(v) for v in row.tolist()]


def render_cov(call: Call[FactorCovarianceParams, CovariancePlan]) -> Response:
    """F of the session: JSON `{date, factors, levels, matrix}`; CSV / Parquet one row per
    factor (factor, level, then one column per factor)."""
    day, snap = call.plan.day, call.snap
    if call.fmt == JSON:
        return document(
            snap,
            {
                "date": call.plan.date,
                "factors": day.keys,
                "levels": day.levels,
                "matrix": [_listed(row) for row in day.cov],
            },
        )
    columns: dict[str, Any] = {"factor": list(day.keys), "level": list(day.levels)}
    for j, key in enumerate(day.keys):
        columns[key] = np.ascontiguousarray(day.cov[:, j])
    return render(
        call.fmt,
        columns,
        envelope={"_metadata": snap.metadata(), "csv_comment": False},
        headers=snap_headers(snap),
        filename=f"factor-covariance_{call.plan.date}",
    )


ENDPOINT = Endpoint(
    path="/api/factor-covariance",
    service="risk",
    price_key="factor-covariance",
    params=FactorCovarianceParams,
    plan=plan_cov,
    size=size,
    formats=FORMATS,
    render=render_cov,
    doc=Doc(
        name="factor_covariance",
        summary="The risk model's factor covariance F of a session",
        description=(
            "F (K x K, daily) of the session's forecast: EWMA volatilities and correlations of "
            "the factor returns (the ETFs the cascade hedges with, or group portfolios) up to "
            "the session before, positive semi-definite, and of the style factors of the "
            "second layer that have a forecast that session (one without is left out that "
            "session: its exposures weigh nothing). JSON `{date, factors, levels, matrix}`; "
            "CSV or Parquet: a row per factor. With /api/specific-risk (H and D) it gives "
            "Sigma = H F H' + D."
        ),
        response_model=FactorCovarianceResponse,
        responses=SERIES_RESPONSES,
    ),
)
