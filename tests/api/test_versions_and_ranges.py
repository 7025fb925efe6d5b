"""Reproducible answers: `version=` (a kept snapshot version) answers that version's bytes even
after a newer build is current; `start`/`end` on the Service B time series (rows, price and
errors); the `vol_23d` and `vol_252d_ann` histories against pandas; `/factor_list`."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.api.fields import VOL_FIELDS
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import Snapshot, SnapshotStore, list_versions
from helpers import TEST_KEY, assert_problem, bearer, register_key

AUTH = {**bearer(TEST_KEY), "Accept-Encoding": "identity"}
DAILY = {"apikey": TEST_KEY, "Accept-Encoding": "identity"}


@pytest.fixture(scope="module")
def client(demo_settings) -> TestClient:
    return TestClient(create_app(demo_settings))


@pytest.fixture(scope="module")
def snap(demo_home: Path) -> Snapshot:
    return SnapshotStore(demo_home).current()


def _row(snap: Snapshot, ticker: str) -> int:
    return int(snap.symbols.loc[ticker, "row"])


def _days(snap: Snapshot) -> np.ndarray:
    return np.datetime_as_string(snap.sessions.astype("datetime64[D]"), unit="D")


def _priced_between(snap: Snapshot, ticker: str, start: str, end: str) -> list[str]:
    days = _days(snap)
    price = np.asarray(snap.array("price_close")[_row(snap, ticker)])
    keep = (days >= start) & (days <= end) & np.isfinite(price)
    return days[keep].tolist()


# ------------------------------------------------------------------------------ version=


def test_a_kept_version_answers_its_own_bytes_after_a_newer_build(
    demo_home: Path, tmp_path: Path
) -> None:
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.model.run import ModelParams

    home = tmp_path / "home"
    shutil.copytree(demo_home / "ingested", home / "ingested")
    first = build_snapshot(home, ModelParams())["model_version"]
    register_key(home, TEST_KEY)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    asks = {
        "/api/ticker-returns": ({"ticker": "NVDA", "start": "2025-01-02"}, AUTH),
        "/api/l3-decomposition": ({"ticker": "AAPL", "format": "csv"}, AUTH),
        "/api/metrics/NVDA": ({}, AUTH),
        "/betas": ({"symbols": "NVDA,BAA", "fact": "Mkt", "start_time": "2025-01-02"}, DAILY),
        "/factor_list": ({}, DAILY),
    }
    before: dict[str, bytes] = {}
    for path, (params, headers) in asks.items():
        pinned = client.get(path, params={**params, "version": first}, headers=headers)
        current = client.get(path, params=params, headers=headers)
        assert pinned.status_code == current.status_code == 200, pinned.text
        assert pinned.content == current.content  # the current version asked by name
        assert pinned.headers["x-model-version"] == first
        before[path] = pinned.content

    second = build_snapshot(home, ModelParams(window=126, min_obs=63))["model_version"]
    assert second != first and list_versions(home) == [first, second]
    for path, (params, headers) in asks.items():
        for _ in range(2):
            again = client.get(path, params={**params, "version": first}, headers=headers)
            assert again.status_code == 200 and again.headers["x-model-version"] == first
            assert again.content == before[path], path
        now = client.get(path, params=params, headers=headers)
        assert now.headers["x-model-version"] == second
    # The model changed (window 126): the current answer is not the kept version's.
    now = client.get("/api/ticker-returns", params=asks["/api/ticker-returns"][0], headers=AUTH)
    assert now.content != before["/api/ticker-returns"]
    # By number too, and the estimate prices the call on the version asked for.
    by_number = client.get(
        "/api/ticker-returns",
        params={"ticker": "NVDA", "version": "1", "start": "2025-01-02"},
        headers=AUTH,
    )
    assert by_number.content == before["/api/ticker-returns"]
    estimate = client.post(
        "/api/estimate",
        json={"endpoint": "ticker-returns", "params": {"ticker": "NVDA", "version": first}},
        headers=AUTH,
    )
    assert estimate.status_code == 200 and estimate.json()["_metadata"]["model_version"] == first

    for url, headers in (
        ("/api/ticker-returns?ticker=NVDA&version=v9", AUTH),
        ("/facts?fact=Mkt&start_time=2025-01-02&version=v3-20990101T000000Z", DAILY),
    ):
        missing = client.get(url, headers=headers)
        body = assert_problem(missing, 404, "VERSION_NOT_FOUND")
        assert body["kept"] == [first, second] and body["parameter"] == "version"
        assert first in body["detail"] and second in body["detail"]


# ------------------------------------------------------------------------------ start / end


def _rows(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def test_start_and_end_serve_exactly_the_priced_sessions_between_them(client, snap) -> None:
    start, end = "2025-03-01", "2025-06-30"
    for path, ticker in (
        ("/api/ticker-returns", "NVDA"),
        ("/api/returns", "DST"),
        ("/api/etf-returns", "XLK"),
        ("/api/l3-decomposition", "AAPL"),
    ):
        resp = client.get(path, params={"ticker": ticker, "start": start, "end": end}, headers=AUTH)
        rows = _rows(resp)
        assert [r["date"] for r in rows] == _priced_between(snap, ticker, start, end), path
        meta = resp.json()["meta"]
        assert (meta["from"], meta["to"], meta["rows"]) == (start, end, len(rows))
        gross = np.asarray(snap.array("return")[_row(snap, ticker)])
        days = list(_days(snap))
        if "returns_gross" in rows[0]:
            for r in rows:
                want = gross[days.index(r["date"])]
                assert r["returns_gross"] == (None if np.isnan(want) else want)
    # start only: up to data_as_of; end only: the `years` years up to end.
    as_of = snap.manifest["data_as_of"]
    rows = _rows(client.get("/api/returns?ticker=NVDA&start=2026-01-02", headers=AUTH))
    assert [r["date"] for r in rows] == _priced_between(snap, "NVDA", "2026-01-02", as_of)
    rows = _rows(client.get("/api/returns?ticker=NVDA&end=2025-06-30&years=2", headers=AUTH))
    assert [r["date"] for r in rows] == _priced_between(snap, "NVDA", "2023-07-01", "2025-06-30")
    # l3: start/end are from/to under the other routes' names.
    named = client.get(
        "/api/l3-decomposition?ticker=AAPL&start=2025-03-01&end=2025-06-30", headers=AUTH
    )
    classic = client.get(
        "/api/l3-decomposition?ticker=AAPL&from=2025-03-01&to=2025-06-30", headers=AUTH
    )
    assert named.content == classic.content


def test_the_price_follows_the_rows_served(client) -> None:
    """The estimate (the charge's own computation) counts the rows the range serves."""
    for start, end in (("2025-03-01", "2025-03-31"), ("2024-01-01", "2025-12-31")):
        params = {"ticker": "NVDA", "start": start, "end": end}
        rows = _rows(client.get("/api/ticker-returns", params=params, headers=AUTH))
        estimate = client.post(
            "/api/estimate", json={"endpoint": "ticker-returns", "params": params}, headers=AUTH
        ).json()
        assert estimate["estimated_rows"] == len(rows)


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("start=2025-06-30&end=2025-03-01", ["start", "end"]),
        ("start=2099-01-02", ["start", "end"]),  # after data_as_of, the default end
        ("start=2025-03-01&years=2", ["years", "start"]),
    ],
)
def test_a_start_after_the_end_or_beside_years_is_a_400(client, query, names) -> None:
    body = assert_problem(
        client.get(f"/api/ticker-returns?ticker=NVDA&{query}", headers=AUTH),
        400,
        "INVALID_PARAMETER",
    )
    assert body["parameters"] == names


@pytest.mark.parametrize(
    "value", ["02/01/2025", "2025-13-01", "2025-1-2", "20250102", "2025-02-30"]
)
def test_a_date_not_in_iso_format_is_a_400_naming_the_format(client, value) -> None:
    for path in ("/api/ticker-returns", "/api/returns", "/api/l3-decomposition"):
        resp = client.get(path, params={"ticker": "NVDA", "start": value}, headers=AUTH)
        body = assert_problem(resp, 400, "INVALID_PARAMETER")
        assert "YYYY-MM-DD" in body["detail"] and body["parameters"] == ["start"]


def test_l3_from_and_start_that_disagree_are_a_400(client) -> None:
    resp = client.get(
        "/api/l3-decomposition?ticker=AAPL&from=2025-03-01&start=2025-03-02", headers=AUTH
    )
    assert assert_problem(resp, 400, "INVALID_PARAMETER")["parameters"] == ["from", "start"]


# ------------------------------------------------------------------------------ vol histories


def _pandas_vols(snap: Snapshot, ticker: str) -> dict[str, pd.Series]:
    """Sample standard deviations of the stored daily returns over 23 (at least 16) and 252
    (at least 126) sessions, annualised by sqrt(252), indexed by day."""
    returns = pd.Series(np.asarray(snap.array("return")[_row(snap, ticker)]), index=_days(snap))
    return {
        "vol_23d": returns.rolling(23, min_periods=16).std() * np.sqrt(252),
        "vol_252d_ann": returns.rolling(252, min_periods=126).std() * np.sqrt(252),
    }


@pytest.mark.parametrize("path", ["/api/ticker-returns", "/api/l3-decomposition"])
@pytest.mark.parametrize("ticker", ["NVDA", "DST", "SPY"])
def test_vol_histories_equal_the_arrays_and_pandas(client, snap, path, ticker) -> None:
    params = {"ticker": ticker, "start": "2024-06-03", "end": "2026-06-30"}
    rows = _rows(client.get(path, params=params, headers=AUTH))
    expected = _pandas_vols(snap, ticker)
    days = list(_days(snap))
    for name in VOL_FIELDS:
        stored = np.asarray(snap.array(name)[_row(snap, ticker)])
        got = np.array([np.nan if r[name] is None else r[name] for r in rows])
        at = [days.index(r["date"]) for r in rows]
        np.testing.assert_array_equal(got, stored[at])
        np.testing.assert_allclose(got, expected[name].iloc[at].to_numpy(), rtol=0, atol=1e-12)
        assert np.isfinite(got).sum() > len(rows) // 2
    # CSV and Parquet carry the same columns.
    for fmt in ("csv", "parquet"):
        resp = client.get(path, params={**params, "format": fmt}, headers=AUTH)
        import io

        frame = (
            pd.read_csv(io.StringIO(resp.text))
            if fmt == "csv"
            else pd.read_parquet(io.BytesIO(resp.content))
        )
        for name in VOL_FIELDS:
            np.testing.assert_allclose(
                frame[name].to_numpy(float),
                [np.nan if r[name] is None else r[name] for r in rows],
                rtol=1e-15,
            )


def test_the_openapi_document_describes_the_new_columns_and_parameters(client) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for row in ("TickerReturnsRow", "L3DecompositionRow"):
        assert set(VOL_FIELDS) <= set(schemas[row]["properties"]), row
    names = {p["name"] for p in doc["paths"]["/api/ticker-returns"]["get"]["parameters"]}
    assert {"start", "end", "version"} <= names
    for path in ("/daily", "/betas", "/facts", "/gross", "/resids", "/symbol_list", "/factor_list"):
        names = {p["name"] for p in doc["paths"][path]["get"]["parameters"]}
        assert "version" in names, path
    assert date.fromisoformat("2025-01-02")  # the documented example format parses
