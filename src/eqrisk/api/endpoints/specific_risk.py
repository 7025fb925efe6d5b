"""`GET /api/specific-risk`: each symbol's exposures H (its hedge ratios of the previous
session on its factors) and specific variance D on a session, with its predicted volatilities:
with /api/factor-covariance, the whole risk model Sigma = H F H' + D of that session."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field
from starlette.responses import Response

from eqrisk.api.answers import document, snap_headers
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.formats import JSON, render, rows_of
from eqrisk.api.models import SERIES_RESPONSES
from eqrisk.api.params import FORMAT_DESCRIPTION, FORMATS, Format, IsoDate, VersionedParams
from eqrisk.api.risk_answers import (
    DATE_DESCRIPTION,
    SpecificRiskResponse,
    risk_session,
    session_date,
)
from eqrisk.api.sizes import Size, approx_bytes
from eqrisk.snapshot.risk_arrays import predicted_of
from eqrisk.snapshot.risk_days import risk_day
from eqrisk.snapshot.versions import Snapshot

SLOTS = ("market", "sector", "subsector")


class SpecificRiskParams(VersionedParams):
    date: IsoDate | None = Field(None, description=DATE_DESCRIPTION)
    format: Format | None = Field(None, description=FORMAT_DESCRIPTION)


@dataclass(frozen=True)
class SpecificPlan:
    t: int
    date: str
    rows: int


def plan_specific(snap: Snapshot, p: SpecificRiskParams) -> SpecificPlan:
    t = risk_session(snap, p.date)
    return SpecificPlan(t, session_date(snap, t), len(snap.row_of))


def size(plan: SpecificPlan, p: SpecificRiskParams) -> Size:
    return Size(1, plan.rows, approx_bytes(plan.rows, 9, p.format or "json", 5))


def columns_of(snap: Snapshot, t: int) -> dict[str, Any]:
    """The rows of session t, in the arrays' row order."""
    day = risk_day(snap, t)
    keys = np.array([*day.factor_keys, None], dtype=object)
    cols: dict[str, Any] = {
        "ticker": [str(s) for s in day.symbols.tolist()],
        "level": day.level.astype(np.int64),
    }
    for j, slot in enumerate(SLOTS):
        idx = day.index[:, j]
        cols[f"{slot}_factor"] = keys[np.where(idx >= 0, idx, len(keys) - 1)].tolist()
        cols[f"{slot}_exposure"] = np.where(idx >= 0, day.values[:, j], np.nan)
    cols["specific_var"] = np.asarray(day.specific_var, dtype=np.float64)
    names = ("risk_total_vol", "risk_factor_vol", "risk_specific_vol")
    stored = predicted_of(snap.path, snap.manifest, {n: snap.array(n) for n in names}, t)
    for name in names:
        cols[name] = stored[name]
    if day.style is not None:  # the second layer: the exposure to each style factor served
        k0 = day.n_etf  # (one without a forecast that session is left out, as from F)
        for j, key in enumerate(day.factor_keys[k0:]):
            if day.served[k0 + j]:
                cols[f"style_{key}"] = np.ascontiguousarray(day.style[:, j])
    return cols


def render_specific(call: Call[SpecificRiskParams, SpecificPlan]) -> Response:
    """H and D of the session, a row per symbol."""
    snap, plan = call.snap, call.plan
    cols = columns_of(snap, plan.t)
    if call.fmt == JSON:
        rows = rows_of(cols)
        clean = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                 for r in rows]  # fmt: skip
        return document(snap, {"date": plan.date, "data": clean})
    return render(
        call.fmt,
        cols,
        envelope={"_metadata": snap.metadata(), "csv_comment": False},
        headers=snap_headers(snap),
        filename=f"specific-risk_{plan.date}",
    )


ENDPOINT = Endpoint(
    path="/api/specific-risk",
    service="risk",
    price_key="specific-risk",
    params=SpecificRiskParams,
    plan=plan_specific,
    size=size,
    formats=FORMATS,
    render=render_specific,
    doc=Doc(
        name="specific_risk",
        summary="Exposures H and specific variances D of every symbol on a session",
        description=(
            "A row per symbol: the hedge level its exposures come from (0: no forecast), its "
            "market, sector and subsector factor with its exposure (the hedge ratios published "
            "the session before), its exposure to each style factor of the second layer "
            "with a forecast that session (`style_<factor>`, the factors of "
            "/api/factor-covariance), its specific variance D (daily, "
            "after both layers) and its predicted total, factor and specific volatility. With "
            "/api/factor-covariance: Sigma = H F H' + D."
        ),
        response_model=SpecificRiskResponse,
        responses=SERIES_RESPONSES,
    ),
)
