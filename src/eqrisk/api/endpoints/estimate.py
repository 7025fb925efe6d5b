"""`POST /api/estimate`: what a call would cost, before making it (free).

How a real call maps to `estimate(endpoint, params, ...)`: `endpoint` is the path after `/api/`
(`"ticker-returns"`, `"batch/analyze"`, ...; `"metrics/NVDA"` or `"metrics"` with
`{"ticker": "NVDA"}`), `params` the query parameters (for POST routes the JSON body). The named
endpoint's own parameters model, plan and price (`Endpoint.quote`) answer, the very code its
route charges with: `estimated_tokens` is exactly what a successful call is charged.
"""

# No `from __future__ import annotations`: pydantic and FastAPI read these annotations.

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field
from starlette.responses import Response

from eqrisk.accounts.pricing import PriceTable, tokens_to_usd
from eqrisk.api.answers import document
from eqrisk.api.deps import snapshot_at
from eqrisk.api.endpoint import Call, Doc, Endpoint
from eqrisk.api.errors import ApiError
from eqrisk.api.models import BODY_ERRORS, JSON_RESPONSES, EstimateResponse
from eqrisk.api.params import BodyParams, validate_params
from eqrisk.snapshot.versions import Snapshot

Estimated = Mapping[str, Endpoint[Any, Any]]  # name (`Endpoint.name`) -> a sized endpoint


class EstimateRequest(BodyParams):
    endpoint: str = Field(
        min_length=1,
        max_length=200,
        description=(
            "The endpoint to price: ticker-returns, returns, etf-returns, metrics (or "
            "metrics/{ticker}), l3-decomposition, batch/analyze, heatmap, portfolio/risk, "
            "factor-covariance, specific-risk, tickers; with or without the /api/ prefix."
        ),
        examples=["ticker-returns"],
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="That endpoint's parameters (query parameters; for batch/analyze its body).",
        examples=[{"ticker": "NVDA", "years": 5}],
    )


def _path_params(name: str, out: dict[str, Any], estimated: Estimated) -> str:
    """`metrics/NVDA` -> `metrics`, moving the path parameter into `out` (a disagreeing
    parameter of the same name is a 400)."""
    for spec in estimated.values():
        found = spec.match("/api/" + name) if spec.path_params else None
        if not found:
            continue
        for key, value in found.items():
            given = out.get(key)
            if given is not None and str(given).strip().upper() != value.strip().upper():
                raise ApiError(
                    "INVALID_PARAMETER",
                    f"endpoint names {key} {value!r} but params.{key} is {given!r}",
                    parameters=["endpoint", f"params.{key}"],
                )
            out[key] = value
        return spec.name
    return name


def endpoint_name(
    endpoint: str, params: Mapping[str, Any], estimated: Estimated
) -> tuple[str, dict[str, Any]]:
    """Normalize `/api/metrics/NVDA`, `api/ticker-returns`, `heatmap`... to an estimated
    endpoint's name (a path parameter moves into the parameters)."""
    name = endpoint.strip().split("?")[0].strip("/")
    name = name[len("api/") :] if name.lower().startswith("api/") else name
    out = dict(params)
    head, _, rest = name.partition("/")
    if name.lower() in estimated:  # a fixed path first: `rankings/top`, not `rankings/{ticker}`
        return name.lower(), out
    if rest and head.lower() in estimated and estimated[head.lower()].path_params:
        name = head.lower() + "/" + rest
    else:
        name = name.lower()
    name = _path_params(name, out, estimated)
    if name not in estimated:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown endpoint {endpoint!r}; accepted: {', '.join(estimated)}",
            parameter="endpoint",
            accepted=list(estimated),
        )
    return name, out


def estimate(
    endpoint: str,
    params: Mapping[str, Any],
    snapshot_of: Callable[[str | None], Snapshot],
    prices: PriceTable,
    estimated: Estimated,
) -> tuple[Snapshot, dict[str, Any]]:
    """The cost of calling `endpoint` with `params` now: exactly what a successful call is
    charged (`estimated_tokens`), with the rows and approximate bytes it would return; and
    the snapshot it was priced on, `snapshot_of` the parameters' `version` (None: current).

    In the route's order: the parameters are read by the endpoint's own model, then the
    version is found, then the call is planned, so that a request both malformed and of an
    unknown version is refused with the route's error. Raises ApiError: INVALID_PARAMETER /
    MISSING_PARAMETER for an unknown endpoint or bad parameters, VERSION_NOT_FOUND, and
    whatever the endpoint's plan raises (TICKER_NOT_FOUND for an unknown ticker of a
    single-ticker endpoint, ...).
    """
    name, params = endpoint_name(endpoint, params, estimated)
    spec = estimated[name]
    assert spec.params is not None and spec.plan is not None and spec.price_key is not None
    parsed = validate_params(spec.params, params)
    snap = snapshot_of(getattr(parsed, "version", None))
    quote = spec.quote(spec.plan(snap, parsed), parsed, prices)
    price = prices[spec.price_key]
    if price.per in ("ticker", "position"):
        minimum = tokens_to_usd(price.minimum_tokens)
        model = f"per_{price.per} (minimum {minimum:g} USD per call)"
    else:
        model = "per_call"
    size = quote.size
    notes = [size.note] if size.note else []
    if quote.tokens == 0:
        notes.append("free" if price.tokens == 0 else "nothing would be charged")
    notes.append("charged only on success; bytes are approximate (JSON unless format says)")
    return snap, {
        "endpoint": name,
        "estimated_cost_usd": tokens_to_usd(quote.tokens),
        "estimated_tokens": quote.tokens,
        "estimated_rows": size.rows,
        "estimated_bytes": size.bytes,
        "unit_cost_usd": price.usd,
        "pricing_model": model,
        "note": "; ".join(notes),
        "limits": dict(spec.limits or {}),
    }


def no_plan(snap: Snapshot, p: EstimateRequest) -> None:
    """The estimate plans the call it prices when it answers (`estimate`)."""


def render(call: Call[EstimateRequest, None]) -> Response:
    state = call.request.app.state

    def snapshot_of(version: str | None) -> Snapshot:
        # A `version` among the priced parameters prices the call on that version, as it runs.
        return call.snap if version is None else snapshot_at(state, version)

    snap, doc = estimate(
        call.params.endpoint, call.params.params, snapshot_of, state.prices, state.estimated
    )
    return document(snap, doc)


ENDPOINT = Endpoint(
    path="/api/estimate",
    method="POST",
    service="risk",
    price_key="estimate",
    params=EstimateRequest,
    plan=no_plan,
    render=render,
    threaded=True,  # it plans the call it prices: in the work threads, within the budget
    doc=Doc(
        name="estimate",
        summary="Pre-flight cost estimate (free)",
        description=(
            "What calling `endpoint` with `params` would cost now: `estimated_tokens` is exactly "
            "what the successful call is charged (1 token = 0.00002 USD). The parameters are "
            "checked as the endpoint checks them: bad ones are a 400, an unknown ticker a 404."
        ),
        response_model=EstimateResponse,
        responses={**JSON_RESPONSES, **BODY_ERRORS},
    ),
)
