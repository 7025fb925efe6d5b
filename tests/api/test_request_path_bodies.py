"""The request path's differential, its other half (see test_request_path.py): a body the
route cannot read is a 4xx and free (the ledger unchanged); the demo key's rules hold on every
encoding; the balance and the account's own reads are charged their price; the demo key's
seven tickers with a share-class twin; a keyed answer its route never priced is refused."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import update

from eqrisk.accounts import db
from eqrisk.accounts.book import STARTING_CREDIT_TOKENS, Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings
from helpers import assert_problem, bearer, new_key
from request_path import (
    ACCEPTED,
    ACCOUNT_OWN,
    BATCH,
    EXAMPLES,
    JSON_TYPE,
    REFUSED,
    Meter,
    endpoint_at,
    make_meter,
    over_series_cap,
    utf8_body,
)


@pytest.fixture(scope="module")
def meter(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Meter:
    return make_meter(demo_home, tmp_path_factory)


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(REFUSED)))
def test_a_body_the_parser_refuses_is_a_4xx_and_free(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    encode, content_type, extra, status = REFUSED[encoding]
    headers = {"content-type": content_type, **extra} if content_type else extra
    for path in ("/api/batch/analyze", "/api/estimate"):
        body = encode(doc if path.endswith("analyze") else {"endpoint": "heatmap"})
        resp, spent = meter.call("POST", path, body=body, headers=headers)
        code = "UNSUPPORTED_MEDIA_TYPE" if status == 415 else resp.json().get("error")
        assert_problem(resp, status, code)
        assert code in ("UNSUPPORTED_MEDIA_TYPE", "INVALID_PARAMETER", "MISSING_PARAMETER")
        assert spent == 0 and resp.headers["x-tokens-consumed"] == "0"


@EXAMPLES
@given(doc=BATCH, encoding=st.sampled_from(sorted(ACCEPTED) + sorted(REFUSED)))
def test_the_demo_keys_rules_hold_in_every_encoding(
    meter: Meter, doc: dict[str, Any], encoding: str
) -> None:
    if encoding in ACCEPTED:
        encode, content_type, extra = ACCEPTED[encoding]
    else:
        encode, content_type, extra, _ = REFUSED[encoding]
    headers = {"content-type": content_type, **extra} if content_type else extra
    resp, spent = meter.call(
        "POST", "/api/batch/analyze", body=encode(doc), headers=headers, key="eqrisk-demo"
    )
    assert spent == 0 and resp.headers.get("x-tokens-consumed", "0") == "0"
    asked = {t.strip().upper() for t in doc["tickers"]}
    outside = {t for t in asked if t not in MAG7 and t != "GOOG"}
    if encoding in REFUSED:
        assert resp.status_code == REFUSED[encoding][3]
    elif over_series_cap(doc):  # the parameters are read before the demo key's screen
        body = assert_problem(resp, 400, "INVALID_PARAMETER")
        assert "ticker-years" in body["detail"]
    elif outside:
        body = assert_problem(resp, 403, "DEMO_RESTRICTED")
        assert all(t in body["detail"] for t in outside)
    elif resp.is_success and resp.headers["content-type"].startswith("application/json"):
        entries = resp.json()["results"].values()
        served = {e["meta"]["ticker"] for e in entries if e["status"] == "success"}
        assert served <= set(MAG7)  # what was served, whatever was asked


def test_a_paid_call_with_a_bom_is_charged_and_the_demo_key_is_refused(meter: Meter) -> None:
    """The report's own case: a body starting with a byte-order mark."""
    body = codecs.BOM_UTF8 + utf8_body({"tickers": ["NVDA", "AAPL", "SPY", "XLK", "KRE", "MSFT"]})
    headers = {"content-type": JSON_TYPE}
    resp, spent = meter.call("POST", "/api/batch/analyze", body=body, headers=headers)
    assert resp.status_code == 200 and spent == meter.prices["batch/analyze"].cost(6)
    demo = codecs.BOM_UTF8 + utf8_body({"tickers": ["JPM", "XOM"]})
    resp, spent = meter.call(
        "POST", "/api/batch/analyze", body=demo, headers=headers, key="eqrisk-demo"
    )
    assert_problem(resp, 403, "DEMO_RESTRICTED")
    assert spent == 0


def test_the_balance_is_charged_its_price(meter: Meter) -> None:
    resp, spent = meter.call("GET", "/api/balance")
    assert resp.status_code == 200 and spent == meter.prices["balance"].tokens
    assert spent == endpoint_at("/api/balance").quote(None, None, meter.prices).tokens


def test_the_accounts_own_reads_are_charged_their_price(meter: Meter) -> None:
    for path in ACCOUNT_OWN[:3]:
        resp, spent = meter.call("GET", path)
        assert resp.status_code == 200 and spent == meter.prices["account"].tokens, path
        assert spent == endpoint_at(path).quote(None, None, meter.prices).tokens


# ------------------------------------------------------------------------------ the class twin


@pytest.fixture(scope="module")
def goog_home(demo_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo market plus GOOG, Alphabet's other share class (a data set that holds the twin
    the real client sends for GOOGL), built."""
    import pandas as pd

    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.data.ingest import ingest
    from eqrisk.model.run import ModelParams

    tmp = tmp_path_factory.mktemp("goog")
    prices = pd.read_csv(demo_home / "demo" / "demo_prices.csv.gz")
    goog = prices[prices["symbol"] == "GOOGL"].copy()
    goog["symbol"] = "GOOG"
    for column in ("open", "high", "low", "close", "adjusted_close"):
        goog[column] *= 0.99
    pd.concat([prices, goog]).to_csv(tmp / "prices.csv.gz", index=False)
    master = pd.read_csv(demo_home / "demo" / "demo_master.csv")
    twin = master[master["symbol"] == "GOOGL"].assign(symbol="GOOG", name="Alphabet Inc. C")
    pd.concat([master, twin]).to_csv(tmp / "master.csv", index=False)
    home = tmp / "home"
    ingest([tmp / "prices.csv.gz"], tmp / "master.csv", home=home, data_source="demo-synthetic")
    build_snapshot(home, ModelParams())
    return home


def test_the_demo_key_gets_its_seven_tickers_only_when_the_data_set_holds_goog(
    goog_home: Path,
) -> None:
    client = TestClient(create_app(Settings(home=goog_home, _env_file=None)))
    accounts = Accounts(make_engine(goog_home))
    _, key = new_key(accounts, rate_limit="1000/minute")
    paid = client.get("/api/metrics/GOOG", headers=bearer(key))
    assert paid.status_code == 200 and paid.json()["ticker"] == "GOOG"  # held: its own data
    with db.transaction(accounts.engine) as conn:
        conn.execute(
            update(db.api_keys)
            .where(db.api_keys.c.is_demo.is_(True))
            .values(rate_limit="1000/minute")
        )
    demo = bearer("eqrisk-demo")
    refused = [
        client.get("/api/metrics/GOOG", headers=demo),
        client.get("/api/metrics/goog", headers=demo),
        client.get("/api/ticker-returns?ticker=GOOG&limit=5", headers=demo),
        client.post("/api/batch/analyze", json={"tickers": ["AAPL", "goog"]}, headers=demo),
        client.get("/daily?symbols=GOOG&start_time=2026-10-01", headers={"apikey": "eqrisk-demo"}),
    ]
    for resp in refused:
        body = assert_problem(resp, 403, "DEMO_RESTRICTED")
        assert "GOOG" in body["detail"].split("not ")[-1] and body["allowed_tickers"] == list(MAG7)
    assert client.get("/api/metrics/GOOGL", headers=demo).json()["ticker"] == "GOOGL"
    heatmap = client.get("/api/heatmap?limit=500", headers=demo).json()
    assert {r["ticker"] for r in heatmap["data"]} == set(MAG7)
    assert client.get("/api/tickers?mag7=true", headers=demo).json()["tickers"] == list(MAG7)


def test_a_keyed_answer_its_route_never_priced_is_refused_and_free(tmp_path: Path) -> None:
    """The gate sends no keyed 2xx without the price its route set: a route that answers
    without the `Metered` dependency (a future route that forgot it) gets a 500, not a free
    answer, and nothing is charged."""
    from starlette.responses import PlainTextResponse

    from eqrisk.accounts.limits import RateLimiter
    from eqrisk.api.gate import Gate

    accounts = Accounts(make_engine(tmp_path))
    account_id, key = new_key(accounts)
    unpriced = PlainTextResponse("paid data, unpriced")
    gate = Gate(unpriced, accounts=accounts, limiter=RateLimiter(), keyed=lambda path: "risk")
    client = TestClient(gate)
    resp = client.get("/api/anything", headers=bearer(key))
    assert resp.status_code == 500 and resp.json()["error"] == "INTERNAL_ERROR"
    assert "paid data" not in resp.text
    assert accounts.balance(account_id) == STARTING_CREDIT_TOKENS
    assert [e for e in accounts.ledger(account_id) if e["kind"] == "charge"] == []
