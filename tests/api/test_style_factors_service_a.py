"""Service A's `/facts`, `/betas` and `/factor_list` carry the risk model's style factors as
factors of their own (JSON and CSV), equal to what `/api/style-exposures` and the stored layer
hold, and `eqrisk export factors` writes them; a version without the layer answers as before."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from eqrisk.snapshot.risk_layer import read_chunked
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import TEST_KEY, export_factors, register_key

KEY = {"apikey": TEST_KEY}  # Service A
AUTH = {"X-API-Key": TEST_KEY}  # Service B
START, END = "2025-03-03", "2025-04-30"


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


@pytest.fixture(scope="module")
def snap(demo_home: Path) -> Snapshot:
    return SnapshotStore(demo_home).current()


def _records(client: TestClient, path: str, fmt: str, **params: Any) -> list[dict[str, Any]]:
    resp = client.get(path, params={**params, "format": fmt}, headers=KEY)
    assert resp.status_code == 200, resp.text
    if fmt == "json":
        body = resp.json()
        assert isinstance(body, list)
        return body
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    number = {"factor_return", "factor_beta"}
    return [{k: (float(v) if k in number else (v or None)) for k, v in r.items()} for r in rows]


def _style_doc(client: TestClient, date: str | None = None) -> dict[str, Any]:
    params = {"date": date} if date else {}
    resp = client.get("/api/style-exposures", params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _days(snap: Snapshot) -> list[str]:
    return np.datetime_as_string(snap.sessions.astype("datetime64[D]"), unit="D").tolist()


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_factor_list_ends_with_the_style_factors(client: TestClient, fmt: str) -> None:
    records = _records(client, "/factor_list", fmt)
    doc = _style_doc(client)
    styles = [f["factor"] for f in doc["factors"]]
    assert styles[:2] == ["residual_market", "size"] and len(styles) >= 6
    flat = [r for r in records if r["level"] != "style"]
    assert flat[0]["fact"] == "Mkt" and all(r["level"] == "L2" for r in flat[1:])
    assert all(r["description"] for r in records)
    tail = records[len(flat) :]
    assert [r["fact"] for r in tail] == styles
    for record, factor in zip(tail, doc["factors"], strict=True):
        assert record["level"] == "style" and record["etf"] is None and record["sector"] is None
        assert record["description"] == factor["description"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_facts_of_a_style_factor_are_its_regression_returns(
    client: TestClient, snap: Snapshot, fmt: str
) -> None:
    days = _days(snap)
    lo, hi = days.index(START), days.index(END) + 1
    styles = [f["factor"] for f in _style_doc(client)["factors"]]
    stored = np.array([read_chunked(snap.path, snap.manifest, "sret", t) for t in range(lo, hi)])
    for j, name in enumerate(styles):
        asked = name.replace("_", " ").upper() if j % 2 else name
        recs = _records(client, "/facts", fmt, fact=asked, start_time=START, end_time=END)
        idx = np.flatnonzero(np.isfinite(stored[:, j]))
        assert len(idx) == hi - lo  # every style has a return on these sessions
        assert [r["teo"] for r in recs] == [f"{days[lo + i]}T00:00:00" for i in idx]
        assert [r["fact"] for r in recs] == [name] * len(idx)
        assert [r["factor_return"] for r in recs] == stored[idx, j].tolist()
    # The route of the layer says the same for a session.
    for date in (START, END):
        doc = _style_doc(client, date)
        for factor in doc["factors"]:
            recs = _records(client, "/facts", fmt, fact=factor["factor"], start_time=date,
                            end_time=date)  # fmt: skip
            assert [r["factor_return"] for r in recs] == [factor["factor_return"]]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_betas_of_a_style_factor_are_the_style_exposures_of_the_next_session(
    client: TestClient, snap: Snapshot, fmt: str
) -> None:
    """The loading at teo t is the exposure known at the close of t: the one
    /api/style-exposures gives for the session after t (for the last close: the default, the
    next session). Stocks outside the layer (an ETF) give no rows."""
    days = _days(snap)
    stocks = ["NVDA", "AAPL", "CRVR"]
    styles = [f["factor"] for f in _style_doc(client)["factors"]]
    for teo in (START, days[-1]):
        t = days.index(teo)
        doc = _style_doc(client, days[t + 1] if t + 1 < len(days) else None)
        exposures = pd.DataFrame(doc["data"]).set_index("ticker")
        for name in styles:
            recs = _records(client, "/betas", fmt, symbols=",".join([*stocks, "SPY"]), fact=name,
                            start_time=teo, end_time=teo)  # fmt: skip
            assert [r["symbol"] for r in recs] == [s for s in stocks if s in exposures.index]
            assert len(recs) >= 2
            for r in recs:
                assert (r["teo"], r["fact"]) == (teo, name)
                assert r["factor_beta"] == exposures.loc[r["symbol"], name]
    recs = _records(client, "/betas", "json", symbols="NVDA", fact="size", start_time=START,
                    end_time=END)  # fmt: skip
    assert [r["teo"] for r in recs] == days[days.index(START) : days.index(END) + 1]
    resp = client.get("/betas", params={"symbols": "NVDA", "fact": "nope", "start_time": START},
                      headers=KEY)  # fmt: skip
    assert resp.status_code == 400 and "size" in resp.json()["accepted"]


def test_export_factors_carries_the_style_factors(
    client: TestClient, snap: Snapshot, demo_home: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    returns, loadings = export_factors(demo_home, tmp_path, monkeypatch)
    days = _days(snap)
    teo = days.index(START)
    doc = _style_doc(client, days[teo + 1])
    styles = [f["factor"] for f in doc["factors"]]
    assert list(returns.columns[-len(styles) :]) == styles
    assert list(loadings.columns[-len(styles) :]) == styles
    returns.index = pd.DatetimeIndex(returns.index).strftime("%Y-%m-%d")
    for t in range(teo, teo + 5):
        stored = read_chunked(snap.path, snap.manifest, "sret", t)
        np.testing.assert_array_equal(returns.loc[days[t], styles].to_numpy(float), stored)
    assert returns.loc[days[teo + 1], styles].tolist() == [
        f["factor_return"] for f in doc["factors"]
    ]
    on = loadings.xs(pd.Timestamp(START), level="date")
    exposures = pd.DataFrame(doc["data"]).set_index("ticker")
    assert len(exposures) >= 30
    for ticker, row in exposures.iterrows():
        assert on.loc[ticker, styles].tolist() == row[styles].tolist()
    outside = on.index.difference(exposures.index)
    assert "SPY" in outside and (on.loc[outside, styles] == 0.0).all().all()


def test_a_version_without_the_layer_answers_as_before(
    client: TestClient, snap: Snapshot, tmp_path: Path
) -> None:
    """The same version with `risk.styles: null` (what a data set without caps stores): no
    style factor in /factor_list, a style name is an unknown factor, the others unchanged,
    and the export holds only the flat model's factors."""
    from eqrisk.snapshot.factor_frames import factor_loadings_frame, factor_returns_frame

    shutil.copytree(snap.path.parent.parent / "snapshots", tmp_path / "snapshots")
    bare_home = tmp_path
    bare = SnapshotStore(bare_home).current()
    manifest = json.loads((bare.path / "manifest.json").read_text())
    assert manifest["risk"]["styles"]
    manifest["risk"]["styles"] = None
    (bare.path / "manifest.json").write_text(json.dumps(manifest))
    register_key(bare_home, TEST_KEY)
    other = TestClient(create_app(Settings(home=bare_home, _env_file=None)))
    bare = SnapshotStore(bare_home).current()
    listed = _records(other, "/factor_list", "json")
    assert [r["fact"] for r in listed] == ["Mkt", *[n for n in bare.factor_names if n != "Mkt"]]
    assert [r for r in _records(client, "/factor_list", "json") if r["level"] != "style"] == listed
    for path, extra in (("/facts", {}), ("/betas", {"symbols": "NVDA"})):
        resp = other.get(path, params={"fact": "size", "start_time": START, **extra}, headers=KEY)
        assert resp.status_code == 400 and "size" not in resp.json()["accepted"]
        params = {"fact": "Mkt", "start_time": START, "end_time": END, **extra}
        assert (
            other.get(path, params=params, headers=KEY).json()
            == client.get(path, params=params, headers=KEY).json()
        )
    assert list(factor_returns_frame(bare).columns) == [r["fact"] for r in listed]
    loadings = factor_loadings_frame(bare)
    assert list(loadings.columns) == [r["fact"] for r in listed]
    full = factor_loadings_frame(snap)
    pd.testing.assert_frame_equal(loadings, full[loadings.columns].loc[loadings.index])
