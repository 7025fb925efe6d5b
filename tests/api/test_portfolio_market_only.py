"""Issue 39: a position that is an ETF but not a factor of the model (QQQ) is modelled on the
market factor alone, and `POST /api/portfolio/risk` says so: its `model_level` is 1 and
`notes` names it. On a snapshot built from a slice of the real data set (the demo market's
ETFs are all factors)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import SHARED_DATA, register_key

KEY = "market-only-etf-test-key-not-secret"
SLICE = ["SPY", "XLK", "SMH", "QQQ", "NVDA", "AMD", "MSFT", "AAPL", "ORCL"]
NOTE = "QQQ: an ETF that is not a factor of the model, modelled on the market factor alone"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.data.ingest import ingest
    from eqrisk.model.run import ModelParams

    home = tmp_path_factory.mktemp("market-only-home")
    wide = pd.read_csv(SHARED_DATA / "adjclose_wide_2010_2026.csv.gz", usecols=["date", *SLICE])
    wide[wide["date"] >= "2019-01-01"].to_csv(home / "prices.csv", index=False)
    master = pd.read_csv(SHARED_DATA / "gics_constituents.csv")
    master[master["Symbol"].isin(SLICE)].to_csv(home / "master.csv", index=False)
    assert ingest([home / "prices.csv"], home / "master.csv", home=home).ok
    build_snapshot(home, ModelParams())
    register_key(home, KEY)
    return TestClient(create_app(Settings(home=home, _env_file=None)))


def _risk(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/api/portfolio/risk", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


@pytest.mark.slow
def test_a_non_factor_etf_is_named_as_modelled_on_the_market_alone(client: TestClient) -> None:
    doc = _risk(client, {"positions": {"QQQ": 0.5, "NVDA": 0.3, "XLK": -0.2}})
    assert doc["notes"] == [NOTE]
    pos = {x["ticker"]: x for x in doc["portfolio"]["positions"]}
    assert {t: x["model_level"] for t, x in pos.items()} == {"QQQ": 1, "NVDA": 3, "XLK": 1}
    assert pos["QQQ"]["model"] == "market factor only"
    assert pos["XLK"]["model"].startswith("a factor of the model itself")
    rows = client.get(
        "/api/specific-risk",
        params={"date": doc["date"]},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()["data"]
    qqq = next(r for r in rows if r["ticker"] == "QQQ")
    assert qqq["level"] == 1 and qqq["market_factor"] == "SPY"
    assert qqq["sector_factor"] is None and qqq["subsector_factor"] is None
    assert qqq["specific_var"] > 0.0
    # A book of stocks and factors only has no note; QQQ as the benchmark is named too.
    assert _risk(client, {"positions": {"NVDA": 1.0, "SMH": -0.5}})["notes"] == []
    bench = _risk(client, {"positions": {"NVDA": 1.0}, "benchmark": "QQQ"})
    assert bench["notes"] == [NOTE]
