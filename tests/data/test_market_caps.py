"""Market caps on the README's real-data path: without them the cap rankings are a free 404
NO_DATA that says what to ingest; with `--shares` they are shares x adjusted close and the
heatmap and `/symbol_list` answer on them. Through the real gate with a metered key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.book import Accounts
from eqrisk.accounts.db import make_engine
from eqrisk.api.app import create_app
from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.ingest import ingest
from eqrisk.data.master_files import read_shares
from eqrisk.data.share_classes import read_share_classes
from eqrisk.model.run import ModelParams
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import TEST_KEY, register_key, shared_file

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
APIKEY = {"apikey": TEST_KEY}
SYMBOL_LIST_USD = "0.001"  # priced by the operator here, so that "not charged" means something


def _served(home: Path) -> tuple[TestClient, Accounts, str]:
    account_id = register_key(home)
    pricing = home / "pricing.json"
    pricing.write_text(json.dumps({"symbol_list": {"usd": SYMBOL_LIST_USD}}))
    settings = Settings(home=home, pricing_file=pricing, _env_file=None)
    return TestClient(create_app(settings)), Accounts(make_engine(home)), account_id


@pytest.fixture(scope="module")
def without_caps(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, Accounts, str]:
    """Real prices and the GICS master, which has no shares or market caps."""
    home = tmp_path_factory.mktemp("no-caps")
    prices = shared_file("small_adjclose_2019_2026.csv.gz")
    report = ingest([prices], shared_file("gics_constituents.csv"), home=home)
    assert report.shares is None
    build_snapshot(home, ModelParams())
    return _served(home)


@pytest.fixture(scope="module")
def with_caps(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, Snapshot, dict]:
    """The README's real-data path: the full price file, the GICS master and `--shares`."""
    home = tmp_path_factory.mktemp("caps")
    report = ingest(
        [shared_file("adjclose_wide_2010_2026.csv.gz")],
        shared_file("gics_constituents.csv"),
        home=home,
        shares=shared_file("constituents_financials.csv"),
    )
    build_snapshot(home, ModelParams())
    client, _, _ = _served(home)
    return client, SnapshotStore(home).current(), report.to_dict()


def _charges(accounts: Accounts, account_id: str) -> list[dict]:
    return [e for e in accounts.ledger(account_id) if e["kind"] == "charge"]


def test_symbol_list_without_top_by_says_it_ranks_by_cap_and_what_else_it_can(
    without_caps,
) -> None:
    """Issue 39: `/symbol_list` with no parameters on a data set without caps: the 404 says
    that the default ranks by market cap and names the rankings the data set has, each of
    which answers."""
    client, _accounts, _account_id = without_caps
    body = client.get("/symbol_list", headers=APIKEY).json()
    assert body["error"] == "NO_DATA" and body["detail"].startswith("top_by defaults to mktcap")
    assert body["rankings_available"] == ["close", "return"]  # a close-only price file
    assert "top_by=close, top_by=return" in body["detail"]
    for key in body["rankings_available"]:
        ranked = client.get("/symbol_list", params={"top_by": key}, headers=APIKEY)
        assert ranked.status_code == 200 and len(ranked.json()["symbols"]) == 10
    asked = client.get("/symbol_list", params={"top_by": "mktcap"}, headers=APIKEY).json()
    assert not asked["detail"].startswith("top_by defaults")


@pytest.mark.parametrize(
    ("method", "path", "payload", "params", "headers"),
    [
        ("GET", "/api/heatmap", None, {}, AUTH),
        ("GET", "/symbol_list", None, {}, APIKEY),
        ("GET", "/symbol_list", None, {"top_by": "mktcap_rank", "format": "csv"}, APIKEY),
    ],
)
def test_cap_rankings_without_caps_are_a_free_no_data_that_says_what_to_ingest(
    without_caps, method, path, payload, params, headers
):
    client, accounts, account_id = without_caps
    before = accounts.balance(account_id)
    charges = len(_charges(accounts, account_id))
    resp = client.request(method, path, params=params, json=payload, headers=headers)
    assert resp.status_code == 404, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["error"] == "NO_DATA" and body["status"] == 404
    assert "no market caps" in body["detail"] and "--shares" in body["detail"]
    assert resp.headers["x-tokens-consumed"] == "0"
    assert accounts.balance(account_id) == before
    assert len(_charges(accounts, account_id)) == charges


def test_the_estimate_of_a_heatmap_without_caps_answers_the_same_no_data(without_caps):
    client, accounts, account_id = without_caps
    before = accounts.balance(account_id)
    estimate = client.post(
        "/api/estimate", json={"endpoint": "heatmap", "params": {}}, headers=AUTH
    )
    route = client.get("/api/heatmap", headers=AUTH)
    assert estimate.status_code == route.status_code == 404
    assert estimate.json()["error"] == route.json()["error"] == "NO_DATA"
    assert estimate.json()["detail"] == route.json()["detail"]
    assert accounts.balance(account_id) == before


def test_rankings_with_values_still_answer_and_are_charged_without_caps(without_caps):
    client, accounts, account_id = without_caps
    before = accounts.balance(account_id)
    resp = client.get("/symbol_list", params={"top_by": "close", "top_n": 5}, headers=APIKEY)
    assert resp.status_code == 200 and len(resp.json()["symbols"]) == 5
    assert accounts.balance(account_id) == before - 50  # 0.001 USD = 50 tokens
    assert _charges(accounts, account_id)[-1]["route"] == "symbol_list"


@pytest.mark.slow
def test_the_share_file_gives_caps_equal_to_price_times_shares(with_caps):
    client, snap, report = with_caps
    counts = read_shares(shared_file("constituents_financials.csv")).set_index("symbol")
    master = set(pd.read_csv(shared_file("gics_constituents.csv"))["Symbol"])
    assert report["shares"]["symbols_with_shares"] == len(set(counts.index) & master) > 400
    fin = pd.read_csv(shared_file("constituents_financials.csv")).set_index("Symbol")
    assert counts.loc["AAPL", "shares"] == fin.loc["AAPL", "Market Cap"] / fin.loc["AAPL", "Price"]

    doc = client.get("/api/heatmap", params={"limit": 20}, headers=AUTH).json()
    assert len(doc["data"]) == 20 and doc["meta"]["eligible"] > 400
    price = snap.array("price_close")
    caps = [row["market_cap"] for row in doc["data"]]
    assert caps == sorted(caps, reverse=True)
    classes = read_share_classes()

    def cap(ticker: str, t: int) -> float:
        r = int(snap.symbols.loc[ticker, "row"])
        return float(price[r, t] * counts.loc[ticker, "shares"])

    for row in doc["data"]:
        t = int(np.flatnonzero(snap.sessions == np.datetime64(row["teo"]))[0])
        # Share classes of one company (GOOG, GOOGL: each given Alphabet's cap by the file)
        # carry the mean of their caps split between them: the company counts once.
        twins = [s for s, c in classes.items() if c == classes.get(row["ticker"])]
        twins = [s for s in twins if s in snap.symbols.index and s in counts.index]
        if len(twins) > 1:
            expected = sum(cap(s, t) for s in twins) / len(twins) ** 2
        else:
            expected = cap(row["ticker"], t)
        assert row["market_cap"] == pytest.approx(expected, rel=1e-12), row["ticker"]
    tickers = [row["ticker"] for row in doc["data"]]
    assert "GOOG" in tickers and "GOOGL" in tickers
    alphabet = sum(row["market_cap"] for row in doc["data"] if row["ticker"] in ("GOOG", "GOOGL"))
    t = int(np.flatnonzero(snap.sessions == np.datetime64(doc["data"][0]["teo"]))[0])
    assert alphabet == pytest.approx((cap("GOOG", t) + cap("GOOGL", t)) / 2, rel=1e-12)

    listed = client.get("/symbol_list", params={"top_n": 20}, headers=APIKEY)
    assert listed.status_code == 200
    assert listed.json()["symbols"] == [row["ticker"] for row in doc["data"]]
    csv_rows = client.get(
        "/symbol_list", params={"top_n": 20, "format": "csv"}, headers=APIKEY
    ).text.replace('"', "")
    assert csv_rows.split() == ["symbol", *listed.json()["symbols"]]
