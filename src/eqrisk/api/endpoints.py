"""The one endpoint registry: every route of both services that the gate sees, once.

The gate's routing (`route_of`: which service, which price key, which key header), the
estimate's endpoint names and parameter models, and the check that the price table and the
routes agree (`check_prices`) all derive from `ENDPOINTS`. A path parameter (the ticker of
`/api/metrics/{ticker}`) is declared here, in the path, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from eqrisk.api import sizes
from eqrisk.api.params import (
    BatchParams,
    BetasQuery,
    DailyQuery,
    EstimateRequest,
    EtfReturnsParams,
    FactsQuery,
    HeatmapParams,
    L3Params,
    MetricsParams,
    Params,
    ReturnsParams,
    SymbolListQuery,
    SymbolsQuery,
    TickerReturnsParams,
    TickersParams,
)
from eqrisk.snapshot.versions import Snapshot

Service = Literal["daily", "risk"]
SizeOf = Callable[[Snapshot, Any], sizes.Size]


@dataclass(frozen=True)
class Endpoint:
    """One route: its path (with `{name}` path parameters), the service that answers it, the
    price-table key that meters it, its parameter model, how to size an answer for the estimate
    (None: not offered by `/api/estimate`), and whether it is open (no key, never metered)."""

    path: str
    service: Service
    price_key: str | None
    params: type[Params] | None = None
    size: SizeOf | None = None
    open: bool = False

    @property
    def name(self) -> str:
        """The estimate's name for it: the path after `/api/`, without path parameters."""
        base = self.path.split("/{", 1)[0]
        return base.removeprefix("/api/").strip("/")

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{"))

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters when `path` is this endpoint's (a trailing slash is the same
        path), else None."""
        want = self.path.strip("/").split("/")
        got = path.strip("/").split("/")
        if len(want) != len(got):
            return None
        found: dict[str, str] = {}
        for w, g in zip(want, got, strict=True):
            if w.startswith("{"):
                if not g:
                    return None
                found[w[1:-1]] = g
            elif w != g:
                return None
        return found


ENDPOINTS: tuple[Endpoint, ...] = (
    # Service B: risk metrics, under /api, keyed by Bearer or X-API-Key.
    Endpoint("/api/ticker-returns", "risk", "ticker-returns", TickerReturnsParams,
             sizes.size_ticker_returns),
    Endpoint("/api/returns", "risk", "returns", ReturnsParams, sizes.size_returns),
    Endpoint("/api/etf-returns", "risk", "etf-returns", EtfReturnsParams, sizes.size_etf_returns),
    Endpoint("/api/metrics/{ticker}", "risk", "metrics", MetricsParams, sizes.size_metrics),
    Endpoint("/api/l3-decomposition", "risk", "l3-decomposition", L3Params, sizes.size_l3),
    Endpoint("/api/batch/analyze", "risk", "batch/analyze", BatchParams, sizes.size_batch),
    Endpoint("/api/heatmap", "risk", "heatmap", HeatmapParams, sizes.size_heatmap),
    Endpoint("/api/tickers", "risk", "tickers", TickersParams, sizes.size_tickers),
    Endpoint("/api/estimate", "risk", "estimate", EstimateRequest),
    Endpoint("/api/balance", "risk", "balance"),
    Endpoint("/api/health", "risk", "health", open=True),
    Endpoint("/api/ready", "risk", None, open=True),
    Endpoint("/api/webhooks/payment", "risk", None, open=True),
    # Service A: daily stock data, at the root, keyed by the `apikey` header.
    Endpoint("/daily", "daily", "daily", DailyQuery),
    Endpoint("/betas", "daily", "betas", BetasQuery),
    Endpoint("/facts", "daily", "facts", FactsQuery),
    Endpoint("/gross", "daily", "gross", SymbolsQuery),
    Endpoint("/resids", "daily", "resids", SymbolsQuery),
    Endpoint("/symbol_list", "daily", "symbol_list", SymbolListQuery),
)  # fmt: skip

ESTIMATED: dict[str, Endpoint] = {e.name: e for e in ENDPOINTS if e.size is not None}


def find(path: str) -> tuple[Endpoint, dict[str, str]] | None:
    """The endpoint a request path names, with its path parameters."""
    for endpoint in ENDPOINTS:
        found = endpoint.match(path)
        if found is not None:
            return endpoint, found
    return None


def route_of(path: str) -> tuple[str, str] | None:
    """(service, price key) of a keyed route, or None for an open or unknown path."""
    hit = find(path)
    if hit is None or hit[0].open or hit[0].price_key is None:
        return None
    return hit[0].service, hit[0].price_key


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
