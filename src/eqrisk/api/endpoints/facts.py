"""`GET /facts`: daily factor returns, Mkt, the GICS sector factors and the style factors of the
risk model's second layer where the version has it (Service A)."""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from dataclasses import dataclass

import numpy as np
from starlette.responses import Response

from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.models import FactorReturnRecord, daily_responses
from eqrisk.api.params import (
    DAILY_FORMATS,
    EndField,
    FactField,
    FormatField,
    StartField,
    VersionedParams,
)
from eqrisk.api.service_a import answer, parse_factor, session_range
from eqrisk.snapshot.index import SymbolIndex
from eqrisk.snapshot.style_series import style_names, style_returns
from eqrisk.snapshot.versions import Snapshot


class FactsQuery(VersionedParams):
    fact: FactField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


@dataclass(frozen=True)
class FactsPlan:
    universe: SymbolIndex
    factor: int  # k < K a factor of the model, K + j style factor j (`parse_factor`)
    lo: int
    hi: int


def plan_facts(snap: Snapshot, q: FactsQuery) -> FactsPlan:
    """The factor, then the range."""
    universe = snap.index
    k = parse_factor(q.fact, universe, style_names(snap.manifest))
    lo, hi = session_range(snap, universe, q.start_time, q.end_time)
    return FactsPlan(universe, k, lo, hi)


def render(call: Call[FactsQuery, FactsPlan]) -> Response:
    """`Mkt` is the market return; a sector factor is the sector series cleaned of the market
    with the previous session's link beta: f_sec(t) = s(t) - g(t-1) m(t); a style factor is its
    return in session t's cross-sectional regression (as /api/style-exposures gives it)."""
    plan = call.plan
    universe, k, lo = plan.universe, plan.factor, plan.lo
    names = universe.factor_names
    if k < len(names):
        block = np.asarray(call.snap.factor_returns[k, lo : plan.hi])
        name = names[k]
    else:
        styles = style_names(call.snap.manifest)
        block = style_returns(call.snap, lo, plan.hi)[:, k - len(names)]
        name = styles[k - len(names)]
    idx = np.flatnonzero(np.isfinite(block))
    columns = {
        "teo": universe.midnight[idx + lo],
        "fact": np.full(len(idx), name, dtype=object),
        "factor_return": block[idx],
    }
    return answer(call.request, call.fmt, universe, columns, "facts")


ENDPOINT = Endpoint(
    path="/facts",
    service="daily",
    price_key="facts",
    params=FactsQuery,
    plan=plan_facts,
    formats=DAILY_FORMATS,
    render=render,
    threaded=True,
    doc=Doc(
        name="facts",
        operation_id="facts",
        summary="Daily factor returns (Mkt, the GICS sector factors, the style factors)",
        response_model=list[FactorReturnRecord],
        responses=daily_responses(not_found=False),
    ),
)
