"""One request path (issue 21), a differential test: for every keyed route, the charge of a
request equals the price its route's own plan gives (`Endpoint.quote`) and what `/api/estimate`
says, for every body encoding and parameter form the route accepts (bodies the parser refuses
and the demo key's rules: test_request_path_bodies.py). Every route is priced here (an
operator's price file made from the registry, tests/request_path.py), so a price of zero hides
nothing; the prices are distinct, so a call priced under another route's key shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eqrisk.api.endpoints import ENDPOINTS
from eqrisk.api.endpoints.portfolio_risk import SENT_PER_UNIT
from request_path import (
    ACCEPTED,
    ACCOUNT_OWN,
    BATCH,
    BODIES,
    ETFS,
    EXAMPLES,
    JSON_TYPE,
    METRICS_PATH,
    PATH_QUERIES,
    PORTFOLIO,
    PRICES,
    QUERIES,
    STOCKS,
    UNKNOWN,
    Meter,
    endpoint_at,
    make_meter,
    maybe,
    query_string,
    spelt,
    utf8_body,
)


@pytest.fixture(scope="module")
def meter(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Meter:
    return make_meter(demo_home, tmp_path_factory)


def test_every_keyed_route_is_in_the_differential() -> None:
    """A new keyed route needs its case (its parameters or its body in tests/request_path.py)."""
    keyed = {e.path for e in ENDPOINTS if not e.open}
    covered = {
        *QUERIES,
        *PATH_QUERIES,
        *BODIES,
        METRICS_PATH,
        "/api/batch/analyze",
        "/api/portfolio/risk",
        "/api/estimate",
        "/api/balance",
        *ACCOUNT_OWN,
    }
    assert keyed == covered
    assert set(PRICES) == {e.price_key for e in ENDPOINTS if not e.open}


@EXAMPLES
@given(data=st.data())
def test_a_get_is_charged_its_plans_price_and_its_estimate_in_every_form(
    meter: Meter, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(QUERIES)))
    spec = endpoint_at(path)
    params = {k: v for k, v in data.draw(QUERIES[path]).items() if v is not None}
    url = f"{path}?{data.draw(query_string(params))}" if params else path
    accept = data.draw(maybe(st.sampled_from(["text/csv", "application/vnd.apache.parquet"])))
    resp, spent = meter.call("GET", url, headers={"accept": accept} if accept else None)
    price = meter.prices[spec.price_key or ""]
    if spec.size is not None:  # offered by /api/estimate: the same status, the same price
        estimate = meter.estimate(spec.name, params)
        assert estimate.status_code == (200 if resp.is_success else resp.status_code), (
            url,
            resp.text[:300],
            estimate.text[:300],
        )
        if resp.is_success:
            assert spent == estimate.json()["estimated_tokens"]
    if resp.is_success:
        assert spent == meter.quote(spec, params) == price.cost(1)


def test_a_bad_parameter_and_an_unknown_version_are_the_routes_error_in_the_estimate(
    meter: Meter,
) -> None:
    """Hypothesis found the estimate looking the version up before reading the parameters:
    the route refused a bad date (400), the estimate the version (404). Both read the
    parameters first now, then the version, then plan."""
    params = {"ticker": "NVDA", "start": "02/06/2025", "version": "v9"}
    resp, _ = meter.call("GET", "/api/ticker-returns?" + urlencode(params))
    estimate = meter.estimate("ticker-returns", params)
    assert resp.status_code == estimate.status_code == 400
    assert resp.json()["error"] == estimate.json()["error"] == "INVALID_PARAMETER"
    assert resp.json()["parameters"] == ["start"]
    assert estimate.json()["parameters"] == ["params.start"]
    good = {"ticker": "NVDA", "start": "2025-02-06", "version": "v9"}
    resp, _ = meter.call("GET", "/api/ticker-returns?" + urlencode(good))
    estimate = meter.estimate("ticker-returns", good)
    assert resp.status_code == estimate.status_code == 404
    assert resp.json()["error"] == estimate.json()["error"] == "VERSION_NOT_FOUND"


@EXAMPLES
@given(ticker=spelt(STOCKS + ETFS + UNKNOWN), form=st.sampled_from(["plain", "escaped"]))
def test_metrics_is_charged_its_plans_price_in_every_spelling(
    meter: Meter, ticker: str, form: str
) -> None:
    written = (
        quote(ticker, safe="") if form == "plain" else "".join(f"%{b:02X}" for b in ticker.encode())
    )
    resp, spent = meter.call("GET", f"/api/metrics/{written}")
    estimate = meter.estimate(f"metrics/{ticker.strip()}", {})
    assert estimate.status_code == (200 if resp.is_success else resp.status_code)
    if resp.is_success:
        spec = endpoint_at(METRICS_PATH)
        assert spent == estimate.json()["estimated_tokens"] == meter.quote(spec, {"ticker": ticker})
        assert spent == meter.prices["metrics"].tokens


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(ACCEPTED)))
def test_a_batch_is_charged_its_plans_price_in_every_accepted_encoding(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    encode, content_type, extra = ACCEPTED[encoding]
    headers = {"content-type": content_type, **extra}
    resp, spent = meter.call("POST", "/api/batch/analyze", body=encode(doc), headers=headers)
    estimate = meter.estimate("batch/analyze", doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if not resp.is_success:
        assert resp.status_code == 400  # the parameters (the same in every encoding), not the bytes
        return
    assert spent == estimate.json()["estimated_tokens"]
    assert spent == meter.quote(endpoint_at("/api/batch/analyze"), doc)
    # Independently of the plan: the price table applied to the answer's own succeeded count.
    asked = list(dict.fromkeys(t.strip().upper() for t in doc["tickers"]))
    if resp.headers["content-type"].startswith("application/json"):
        succeeded = resp.json()["summary"]["succeeded"]
    else:
        failed = resp.headers["x-failed-tickers"]
        succeeded = len(asked) - (len(failed.split(",")) if failed else 0)
    assert spent == meter.prices["batch/analyze"].cost(succeeded)


@EXAMPLES
@given(data=st.data())
def test_a_path_route_is_charged_its_plans_price_and_its_estimate(
    meter: Meter, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(PATH_QUERIES)))
    spec = endpoint_at(path)
    (name,) = spec.path_params
    names = ["uni_mc_50", "UNI_DV_500", "uni_mc_7"] if name == "name" else STOCKS + ETFS + UNKNOWN
    value = data.draw(spelt(names)).strip()
    params = data.draw(PATH_QUERIES[path])
    url = path.replace("{" + name + "}", quote(value, safe=""))
    resp, spent = meter.call("GET", f"{url}?{urlencode(params)}" if params else url)
    estimate = meter.estimate(url.removeprefix("/api/"), params)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if resp.is_success:
        assert spent == estimate.json()["estimated_tokens"]
        assert spent == meter.quote(spec, {**params, name: value})
        assert spent == meter.prices[spec.price_key or ""].cost(1)


@EXAMPLES
@given(data=st.data(), encoding=st.sampled_from(sorted(ACCEPTED)))
def test_a_post_route_is_charged_its_plans_price_in_every_accepted_encoding(
    meter: Meter, data: st.DataObject, encoding: str
) -> None:
    path = data.draw(st.sampled_from(sorted(BODIES)))
    doc = data.draw(BODIES[path])
    encode, content_type, extra = ACCEPTED[encoding]
    headers = {"content-type": content_type, **extra}
    resp, spent = meter.call("POST", path, body=encode(doc), headers=headers)
    spec = endpoint_at(path)
    estimate = meter.estimate(spec.name, doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if resp.is_success:
        assert spent == estimate.json()["estimated_tokens"] == meter.quote(spec, doc)
        price = meter.prices[spec.price_key or ""]
        if price.per == "call" and spent:  # zero: a call that is not charged (no position)
            assert spent == price.cost(1)
    else:
        assert 400 <= resp.status_code < 500 and spent == 0


@EXAMPLES
@given(doc=PORTFOLIO)
def test_a_portfolio_is_charged_per_position_used_as_estimated(
    meter: Meter, doc: dict[str, Any]
) -> None:
    resp, spent = meter.call(
        "POST", "/api/portfolio/risk", body=utf8_body(doc), headers={"content-type": JSON_TYPE}
    )
    estimate = meter.estimate("portfolio/risk", doc)
    assert estimate.status_code == (200 if resp.is_success else resp.status_code), resp.text[:300]
    if not resp.is_success:
        assert spent == 0
        return
    assert spent == estimate.json()["estimated_tokens"]
    assert spent == meter.quote(endpoint_at("/api/portfolio/risk"), doc)
    used = len(resp.json()["portfolio"]["positions"])
    # one unit per position used, and at least one per SENT_PER_UNIT positions sent
    bench = doc.get("benchmark")
    sent = len(doc["positions"]) + (
        len(bench) if isinstance(bench, dict) else int(bench is not None)
    )
    floor = -(-sent // SENT_PER_UNIT)
    assert spent == meter.prices["portfolio/risk"].cost(max(used, floor))
