"""The one endpoint table: every route of both services, one `Endpoint` object each, in one
module each (docs/CONTRIBUTING.md, "Add a route").

The app registers its FastAPI routes from `ENDPOINTS` (`endpoint.register_all`); the gate asks
`keyed_service` which key a path needs; `/api/estimate` offers `ESTIMATED`; `check_prices`
holds the table and the price table to each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eqrisk.api.endpoint import Endpoint
from eqrisk.api.endpoints import (
    account,
    account_self,
    batch_analyze,
    betas,
    correlation,
    daily,
    decompose,
    estimate,
    factor_covariance,
    factor_list,
    facts,
    health,
    heatmap,
    l3_decomposition,
    latest_metrics,
    lstar,
    macro,
    metrics,
    portfolio_risk,
    rankings,
    ready,
    returns,
    returns_decomposition,
    risk_index,
    signup,
    specific_risk,
    style_exposures,
    symbol_list,
    symbol_returns,
    ticker_returns,
    tickers,
    universe,
)

ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (
    # Service B: risk metrics, under /api, keyed by Bearer or X-API-Key.
    ticker_returns.ENDPOINT,
    returns.RETURNS,
    returns.ETF_RETURNS,
    metrics.ENDPOINT,
    l3_decomposition.ENDPOINT,
    batch_analyze.ENDPOINT,
    heatmap.ENDPOINT,
    portfolio_risk.ENDPOINT,
    factor_covariance.ENDPOINT,
    specific_risk.ENDPOINT,
    style_exposures.ENDPOINT,
    tickers.ENDPOINT,
    estimate.ENDPOINT,
    account.BALANCE,
    account_self.USAGE,
    account_self.LEDGER,
    account_self.KEYS,
    account_self.MANAGE_KEYS,
    account_self.TOPUP,
    health.ENDPOINT,
    ready.ENDPOINT,
    account.PAYMENT_WEBHOOK,
    signup.SIGNUP_OPTIONS,
    signup.SIGNUP,
    signup.SIGNUP_CLAIM,
    signup.STRIPE_WEBHOOK,
    # Service A: daily stock data, at the root, keyed by the `apikey` header.
    daily.ENDPOINT,
    betas.ENDPOINT,
    facts.ENDPOINT,
    symbol_returns.GROSS,
    symbol_returns.RESIDS,
    symbol_list.ENDPOINT,
    factor_list.ENDPOINT,
    # Service B beyond the specification: the rest of the real client (drop-in-routes.md).
    decompose.ENDPOINT,
    latest_metrics.ENDPOINT,
    returns_decomposition.ENDPOINT,
    rankings.TOP,  # before rankings/{ticker}: a path is matched in this order
    rankings.SCREEN,
    rankings.TICKER,
    macro.MACRO,
    macro.ETF_FACTORS,
    correlation.POST,
    correlation.SINGLE,
    lstar.LSTAR,
    lstar.BATCH,
    risk_index.ENDPOINT,
    universe.PANEL,
    universe.MEMBERS,
)

# The endpoints /api/estimate prices, by name (`Endpoint.name`): those with a size.
ESTIMATED: dict[str, Endpoint[Any, Any]] = {e.name: e for e in ENDPOINTS if e.size is not None}

_KEYED_PATHS: dict[str, str] = {
    e.path: e.service for e in ENDPOINTS if not e.open and "{" not in e.path
}
_KEYED_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    (e.path.split("{", 1)[0], e.service)
    for e in ENDPOINTS
    if not e.open and "{" in e.path and e.path.endswith("}")
)
_DEEP_PARAMS: tuple[Endpoint[Any, Any], ...] = tuple(
    e for e in ENDPOINTS if not e.open and "{" in e.path and not e.path.endswith("}")
)


def keyed_service(path: str) -> str | None:
    """The service whose key `path` needs ("risk" or "daily"; a trailing slash is the same
    path), or None for an open or unknown path. The gate's only question about a request; the
    route itself is matched, once, by the router."""
    path = path.rstrip("/") or "/"
    service = _KEYED_PATHS.get(path)
    if service is not None:
        return service
    for prefix, service in _KEYED_PREFIXES:
        if path.startswith(prefix) and "/" not in path[len(prefix) :]:
            return service
    for endpoint in _DEEP_PARAMS:  # a path parameter followed by more path
        if endpoint.match(path) is not None:
            return endpoint.service
    return None


def route_of(path: str) -> tuple[str, str] | None:
    """(service, price key) of a keyed route, or None for an open or unknown path."""
    for endpoint in ENDPOINTS:
        if endpoint.match(path) is not None and not endpoint.open and endpoint.price_key:
            return endpoint.service, endpoint.price_key
    return None


def check_prices(price_keys: Iterable[str]) -> None:
    """Every metered endpoint has a price and every price key meters an endpoint; raises
    ValueError naming the difference (a route nobody pays for, or a price nobody charges)."""
    metered = {e.price_key for e in ENDPOINTS if e.price_key is not None}
    keys = set(price_keys)
    problems = []
    if metered - keys:
        problems.append(f"endpoints without a price: {', '.join(sorted(metered - keys))}")
    if keys - metered:
        problems.append(f"prices without an endpoint: {', '.join(sorted(keys - metered))}")
    if problems:
        raise ValueError("; ".join(problems))
