"""`build --accuracy`: the snapshot carries the risk forecast's accuracy record (what
`risk_evaluation.risk_accuracy` measures on the same data), an incremental build carries it
forward, and /api/health serves it with the model version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.data.ingested import read_ingested
from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import to_panel
from eqrisk.model.risk_model import RiskParams
from eqrisk.model.run import ModelParams
from eqrisk.settings import Settings
from eqrisk.snapshot.build import build_snapshot
from eqrisk.snapshot.demo_build import build_demo
from eqrisk.snapshot.risk_evaluation import risk_accuracy


@pytest.fixture(scope="module")
def short_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("accuracy-home")
    first = build_demo(home, start="2022-09-01")
    assert "risk_accuracy" not in first  # measured only when asked
    return home


def test_the_build_stores_the_record_and_health_serves_it(short_home: Path) -> None:
    manifest = build_snapshot(short_home, ModelParams(), full=True, accuracy=True)
    record = json.loads(json.dumps(manifest["risk_accuracy"]))  # as stored
    prices, raw, _meta = read_ingested(short_home)
    master = classify(raw, Mappings.load(None, None), market_etf="SPY")
    want = risk_accuracy(to_panel(prices, raw), master, ModelParams(), RiskParams())
    assert record == json.loads(json.dumps(want))
    one_day = record["horizons"]["1d"]
    assert set(one_day) == set(record["families"])
    for family in one_day.values():
        lo, hi = family["band"]
        assert lo < 1 < hi and family["model"]["bias"] > 0
    # An incremental build (nothing new: the same inputs) carries the record.
    again = build_snapshot(short_home, ModelParams())
    assert again["build"]["mode"] == "incremental"
    assert again["risk_accuracy"] == record
    client = TestClient(create_app(Settings(home=short_home, _env_file=None)))
    health = client.get("/api/health").json()
    assert health["model_version"] == again["model_version"]
    assert health["risk_accuracy"] == record
