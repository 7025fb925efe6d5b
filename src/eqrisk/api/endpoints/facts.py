"""`GET /facts`: daily factor returns, Mkt and the GICS sector factors (Service A)."""

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
from eqrisk.snapshot.versions import Snapshot


class FactsQuery(VersionedParams):
    fact: FactField
    start_time: StartField
    end_time: EndField = None
    format: FormatField = None


@dataclass(frozen=True)
class FactsPlan:
    universe: SymbolIndex
    factor: int
    lo: int
    hi: int


def plan_facts(snap: Snapshot, q: FactsQuery) -> FactsPlan:
    """The factor, then the range."""
    universe = snap.index
    k = parse_factor(q.fact, universe)
    lo, hi = session_range(snap, universe, q.start_time, q.end_time)
    return FactsPlan(universe, k, lo, hi)


def render(call: Call[FactsQuery, FactsPlan]) -> Response:
    """`Mkt` is the market return; a sector factor is the sector series cleaned of the market
    with the previous session's link beta: f_sec(t) = s(t) - g(t-1) m(t)."""
    plan = call.plan
    universe, k, lo = plan.universe, plan.factor, plan.lo
    block = np.asarray(call.snap.factor_returns[k, lo : plan.hi])
    idx = np.flatnonzero(np.isfinite(block))
    columns = {
        "teo": universe.midnight[idx + lo],
        "fact": np.full(len(idx), universe.factor_names[k], dtype=object),
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
        summary="Daily factor returns (Mkt and the GICS sector factors)",
        response_model=list[FactorReturnRecord],
        responses=daily_responses(not_found=False),
    ),
)
