"""The endpoint table: the app's routes are registered from it, the gate's question (which key a
path needs), the estimate's names and the price table derive from it, and they agree with the
routes the app actually serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from eqrisk.accounts.pricing import DEFAULT_PRICES
from eqrisk.api.app import create_app
from eqrisk.api.endpoints import ENDPOINTS, ESTIMATED, check_prices, keyed_service, route_of
from eqrisk.api.endpoints.estimate import endpoint_name
from eqrisk.api.endpoints.metrics import ENDPOINT as METRICS
from eqrisk.settings import Settings


def test_every_price_key_meters_an_endpoint_and_every_endpoint_is_priced() -> None:
    check_prices(DEFAULT_PRICES)  # raises on a difference
    with pytest.raises(ValueError, match="endpoints without a price: heatmap"):
        check_prices(set(DEFAULT_PRICES) - {"heatmap"})
    with pytest.raises(ValueError, match="prices without an endpoint: portfolio"):
        check_prices({*DEFAULT_PRICES, "portfolio"})


def test_the_registry_lists_exactly_the_routes_the_app_serves(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path, _env_file=None), services=("daily", "risk"))
    served = set(app.openapi()["paths"])
    assert served == {e.path for e in ENDPOINTS}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/metrics/NVDA", ("risk", "metrics")),
        ("/api/metrics/NVDA/", ("risk", "metrics")),
        ("/api/ticker-returns", ("risk", "ticker-returns")),
        ("/api/batch/analyze", ("risk", "batch/analyze")),
        ("/api/balance", ("risk", "balance")),
        ("/daily", ("daily", "daily")),
        ("/symbol_list/", ("daily", "symbol_list")),
        ("/api/health", None),  # open
        ("/api/webhooks/payment", None),  # open, signed instead
        ("/api/metrics", None),  # the ticker is in the path
        ("/api/nope", None),
        ("/nope", None),
    ],
)
def test_route_of_reads_the_registry(path: str, expected: tuple[str, str] | None) -> None:
    assert route_of(path) == expected
    # The gate's one question: which service's key the path needs (None: open or unknown).
    assert keyed_service(path) == (expected[0] if expected else None)


def test_the_metrics_ticker_comes_from_the_path() -> None:
    assert METRICS.match("/api/metrics/AAPL") == {"ticker": "AAPL"}
    assert endpoint_name("/api/metrics/AAPL", {}, ESTIMATED) == ("metrics", {"ticker": "AAPL"})
    assert endpoint_name("METRICS/aapl", {"years": 1}, ESTIMATED) == (
        "metrics",
        {"years": 1, "ticker": "aapl"},
    )
    assert endpoint_name("batch/analyze", {}, ESTIMATED) == ("batch/analyze", {})


def test_the_estimate_offers_the_sized_endpoints_in_registry_order() -> None:
    """The estimate's names are read from the registry (every endpoint with a size, in its
    order); every metered Service B route is among them, each found by its own name."""
    assert list(ESTIMATED) == [e.name for e in ENDPOINTS if e.size is not None]
    metered = {
        e.name
        for e in ENDPOINTS
        if e.service == "risk"
        and not e.open
        and (DEFAULT_PRICES[e.price_key].tokens or DEFAULT_PRICES[e.price_key].minimum_tokens)
    }
    assert metered <= set(ESTIMATED), sorted(metered - set(ESTIMATED))
    for name in ESTIMATED:
        assert endpoint_name(name.upper(), {}, ESTIMATED)[0] == name


def test_the_openapi_document_has_the_package_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    import eqrisk

    app = create_app(Settings(home=tmp_path, _env_file=None))
    assert app.openapi()["info"]["version"] == eqrisk.__version__ == version("eqrisk")
