"""The pre-flight estimate of Service B: what a call would cost, before making it.

How a real call maps to `estimate(endpoint, params, ...)`: `endpoint` is the path after `/api/`
(`"ticker-returns"`, `"batch/analyze"`, ...; `"metrics/NVDA"` or `"metrics"` with
`{"ticker": "NVDA"}`), `params` the query parameters (for POST routes the JSON body). The
endpoints, their models and sizes come from the registry (`endpoints.ESTIMATED`), the price from
the price table; the gate charges exactly `estimated_tokens` for a successful call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eqrisk.accounts.pricing import PriceTable, tokens_to_usd
from eqrisk.api.endpoints import ENDPOINTS, ESTIMATED
from eqrisk.api.errors import ApiError
from eqrisk.api.params import validate_params
from eqrisk.api.sizes import Size
from eqrisk.snapshot.versions import Snapshot


def _path_params(name: str, out: dict[str, Any]) -> str:
    """`metrics/NVDA` -> `metrics`, moving the path parameter into `out` (a disagreeing
    parameter of the same name is a 400)."""
    for spec in ENDPOINTS:
        found = spec.match("/api/" + name) if spec.path_params and spec.size else None
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


def endpoint_name(endpoint: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Normalize `/api/metrics/NVDA`, `api/ticker-returns`, `heatmap`... to an estimated
    endpoint's name (a path parameter moves into the parameters)."""
    name = endpoint.strip().split("?")[0].strip("/")
    name = name[len("api/") :] if name.lower().startswith("api/") else name
    out = dict(params)
    head, _, rest = name.partition("/")
    if rest and head.lower() in ESTIMATED and ESTIMATED[head.lower()].path_params:
        name = head.lower() + "/" + rest
    else:
        name = name.lower()
    name = _path_params(name, out)
    if name not in ESTIMATED:
        raise ApiError(
            "INVALID_PARAMETER",
            f"unknown endpoint {endpoint!r}; accepted: {', '.join(ESTIMATED)}",
            parameter="endpoint",
            accepted=list(ESTIMATED),
        )
    return name, out


def estimate(
    endpoint: str, params: Mapping[str, Any], snap: Snapshot, prices: PriceTable
) -> dict[str, Any]:
    """The cost of calling `endpoint` with `params` now: exactly what a successful call is
    charged (`estimated_tokens`), with the rows and approximate bytes it would return.

    Raises ApiError: INVALID_PARAMETER / MISSING_PARAMETER for an unknown endpoint or bad
    parameters (the same checks as the route), TICKER_NOT_FOUND for an unknown ticker of a
    single-ticker endpoint.
    """
    name, params = endpoint_name(endpoint, params)
    spec = ESTIMATED[name]
    assert spec.params is not None and spec.size is not None
    parsed = validate_params(spec.params, params)
    size: Size = spec.size(snap, parsed)
    price = prices[name]
    tokens = price.cost(size.units)
    if price.per == "ticker":
        model = f"per_ticker (minimum {tokens_to_usd(price.minimum_tokens):g} USD per call)"
    else:
        model = "per_call"
    notes = [size.note] if size.note else []
    if tokens == 0:
        notes.append("free" if price.tokens == 0 else "nothing would be charged")
    notes.append("charged only on success; bytes are approximate (JSON unless format says)")
    return {
        "endpoint": name,
        "estimated_cost_usd": tokens_to_usd(tokens),
        "estimated_tokens": tokens,
        "estimated_rows": size.rows,
        "estimated_bytes": size.bytes,
        "unit_cost_usd": price.usd,
        "pricing_model": model,
        "note": "; ".join(notes),
    }
