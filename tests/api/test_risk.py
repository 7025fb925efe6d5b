"""Service B (risk metrics) in-process: answers equal the snapshot's arrays, formats round-trip,
estimates equal the price table and the charged units, errors have the one problem shape."""

from __future__ import annotations

import io
import json
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from eqrisk.accounts.pricing import PriceTable
from eqrisk.api import fields
from eqrisk.api.app import create_app
from eqrisk.api.endpoints import ESTIMATED
from eqrisk.api.endpoints.estimate import estimate
from eqrisk.api.endpoints.heatmap import HEATMAP_DEFAULT
from eqrisk.api.endpoints.tickers import SEARCH_LIMIT
from eqrisk.data.master import MAG7
from eqrisk.settings import Settings
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import TEST_KEY, assert_problem, register_key

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
# NVDA: full L3; AAPL: no subsector ETF (stops at L2); SPY and XLK: ETFs; CRVR: listed 2018;
# DST: a stock with halts (missing sessions); TAIS: delisted 2024-08-16.
TICKERS = ["NVDA", "AAPL", "SPY", "XLK", "CRVR", "DST"]


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


@pytest.fixture(scope="module")
def snap(demo_home: Path) -> Snapshot:
    return SnapshotStore(demo_home).current()


def floats(values: list[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def window(snap: Snapshot, ticker: str, start: date, end: date) -> tuple[int, np.ndarray]:
    """Row of `ticker` and the session indices in [start, end] where it has a price."""
    row = int(snap.symbols.loc[ticker, "row"])
    sessions = snap.sessions
    inside = (sessions >= np.datetime64(start)) & (sessions <= np.datetime64(end))
    priced = np.isfinite(snap.array("price_close")[row])
    return row, np.flatnonzero(inside & priced)


def years_start(snap: Snapshot, years: int) -> date:
    as_of = date.fromisoformat(snap.manifest["data_as_of"])
    try:
        back = as_of.replace(year=as_of.year - years)
    except ValueError:
        back = as_of.replace(year=as_of.year - years, day=28)
    return date.fromordinal(back.toordinal() + 1)


def assert_from_snapshot(resp: Any, snap: Snapshot) -> None:
    assert resp.headers["x-model-version"] == snap.version
    assert resp.headers["x-data-as-of"] == snap.manifest["data_as_of"]


# --------------------------------------------------------------------------- auth, health


def test_health_needs_no_key_and_names_the_served_version(client, snap):
    resp = client.get("/api/health")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ok",
        "model_version": snap.version,
        "data_as_of": snap.manifest["data_as_of"],
        "risk_accuracy": snap.manifest["risk_accuracy"],  # every build stores it (issue 34)
    }
    assert resp.json()["risk_accuracy"]["horizons"]["1d"]["single_stocks"]["members"] > 100
    assert_from_snapshot(resp, snap)


KEYED_ROUTES = [
    ("GET", "/api/tickers", None),
    ("GET", "/api/metrics/NVDA", None),
    ("GET", "/api/ticker-returns?ticker=NVDA", None),
    ("GET", "/api/returns?ticker=NVDA", None),
    ("GET", "/api/etf-returns?ticker=SPY", None),
    ("GET", "/api/l3-decomposition?ticker=NVDA", None),
    ("POST", "/api/estimate", {"endpoint": "heatmap"}),
    ("POST", "/api/batch/analyze", {"tickers": ["NVDA"]}),
    ("GET", "/api/heatmap", None),
    ("GET", "/api/balance", None),
]


@pytest.mark.parametrize(("method", "url", "body"), KEYED_ROUTES)
def test_every_route_but_health_needs_a_valid_key(client, method, url, body):
    assert_problem(client.request(method, url, json=body), 401, "AUTHENTICATION_REQUIRED")
    bad = {"Authorization": "Bearer not-a-key"}
    assert_problem(client.request(method, url, json=body, headers=bad), 401, "INVALID_API_KEY")
    for headers in (AUTH, {"X-API-Key": TEST_KEY}, {"Authorization": f"bearer {TEST_KEY}"}):
        resp = client.request(method, url, json=body, headers=headers)
        assert resp.status_code == 200, resp.text


def test_balance_says_who_calls(client):
    demo = client.get("/api/balance", headers={"X-API-Key": "eqrisk-demo"}).json()
    assert demo["is_demo"] is True and demo["account_id"] == "demo"
    assert demo["key_id"].startswith("demo-") and demo["balance_usd"] == 0
    mine = client.get("/api/balance", headers=AUTH).json()
    assert mine["is_demo"] is False and mine["state"] == "verified"
    assert mine["balance_tokens"] > 10**12 - 10**9


# --------------------------------------------------------------------------- tickers


def test_tickers_lists_every_symbol_sorted_with_metadata(client, snap):
    for url in ("/api/tickers", "/api/tickers?array=ticker"):
        resp = client.get(url, headers=AUTH)
        doc = resp.json()
        assert doc["tickers"] == sorted(snap.symbols["ticker"])
        assert doc["count"] == len(snap.symbols)
        assert doc["_metadata"] == snap.metadata()
        assert_from_snapshot(resp, snap)


def test_tickers_mag7_and_asset_type_filter(client, snap):
    assert client.get("/api/tickers?mag7=true", headers=AUTH).json()["tickers"] == list(MAG7)
    etfs = client.get("/api/tickers?asset_type=etf", headers=AUTH).json()["tickers"]
    expected = snap.symbols[snap.symbols["asset_type"] == "etf"]["ticker"]
    assert etfs == sorted(expected)
    assert "SPY" in etfs and "NVDA" not in etfs


def test_search_puts_the_exact_symbol_first_then_prefixes_then_names(client, snap):
    hits = client.get("/api/tickers?search=nvda", headers=AUTH).json()["results"]
    assert hits[0] == {
        "ticker": "NVDA",
        "company_name": "NVIDIA Corporation",
        "sector": "Information Technology",
        "asset_type": "stock",
    }
    xl = client.get("/api/tickers?search=XL", headers=AUTH).json()
    assert 1 <= xl["count"] <= SEARCH_LIMIT
    assert all(h["ticker"].startswith("XL") for h in xl["results"])
    apple = client.get("/api/tickers?search=apple", headers=AUTH).json()["results"]
    assert apple[0]["ticker"] == "AAPL"
    banks = client.get("/api/tickers?search=bank&asset_type=stock", headers=AUTH).json()
    names = snap.symbols[snap.symbols["asset_type"] == "stock"]["name"].str.lower()
    assert banks["count"] == min(SEARCH_LIMIT, int(names.str.contains("bank").sum())) > 0
    every = client.get("/api/tickers?search=e", headers=AUTH).json()
    assert every["count"] == SEARCH_LIMIT
    assert all("bank" in h["company_name"].lower() for h in banks["results"])
    assert all(h["asset_type"] == "stock" for h in banks["results"])
    none = client.get("/api/tickers?search=zzzzqq", headers=AUTH).json()
    assert none["results"] == [] and none["count"] == 0


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("ticker", TICKERS)
def test_metrics_equal_the_arrays_on_the_latest_priced_session(client, snap, ticker):
    resp = client.get(f"/api/metrics/{ticker.lower()}", headers=AUTH)
    doc = resp.json()
    row = int(snap.symbols.loc[ticker, "row"])
    t = int(np.flatnonzero(np.isfinite(snap.array("price_close")[row]))[-1])
    assert doc["ticker"] == ticker
    assert doc["teo"] == str(snap.sessions[t])
    for name, field in fields.METRICS_FIELDS.items():
        got = floats([doc["metrics"][name]])[0]
        assert np.array_equal(got, snap.array(field)[row, t], equal_nan=True), name
    info = json.loads(snap.symbols.loc[ticker, "metadata"])
    for key in ("company_name", "sector", "industry", "market_etf", "sector_etf", "subsector_etf"):
        assert doc["meta"][key] == info[key]
    assert doc["meta"]["asset_type"] == snap.symbols.loc[ticker, "asset_type"]
    assert doc["_metadata"] == snap.metadata()
    assert_from_snapshot(resp, snap)


def test_metrics_of_a_stock_without_subsector_etf_has_null_subsector(client):
    doc = client.get("/api/metrics/AAPL", headers=AUTH).json()
    assert doc["meta"]["subsector_etf"] is None
    assert doc["metrics"]["l3_sub_hr"] is None and doc["metrics"]["l3_sub_er"] is None
    assert doc["metrics"]["l3_sec_hr"] is not None


# --------------------------------------------------------------------------- time series

SERIES_ROUTES = {
    "ticker-returns": fields.TICKER_RETURNS_COLUMNS,
    "returns": fields.RETURNS_COLUMNS,
    "etf-returns": fields.RETURNS_COLUMNS,
}


def _route_for(snap: Snapshot, ticker: str) -> str:
    return "returns" if snap.symbols.loc[ticker, "asset_type"] == "stock" else "etf-returns"


@pytest.mark.parametrize("ticker", TICKERS)
@pytest.mark.parametrize("years", [1, 5, 13])
def test_ticker_returns_rows_equal_the_arrays(client, snap, ticker, years):
    resp = client.get(f"/api/ticker-returns?ticker={ticker}&years={years}", headers=AUTH)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    start, end = years_start(snap, years), date.fromisoformat(snap.manifest["data_as_of"])
    row, cols = window(snap, ticker, start, end)
    assert [r["date"] for r in doc["data"]] == [str(d) for d in snap.sessions[cols]]
    for name, field in fields.TICKER_RETURNS_COLUMNS.items():
        got = floats([r[name] for r in doc["data"]])
        assert np.array_equal(got, snap.array(field)[row, cols], equal_nan=True), name
    assert list(doc["data"][0]) == ["date", *fields.TICKER_RETURNS_COLUMNS]
    sym = snap.symbols.loc[ticker]
    assert doc["meta"] == {
        "ticker": ticker,
        "company_name": sym["name"],
        "asset_type": sym["asset_type"],
        "market_etf": sym["market_etf"] if isinstance(sym["market_etf"], str) else None,
        "sector_etf": sym["sector_etf"] if isinstance(sym["sector_etf"], str) else None,
        "subsector_etf": sym["subsector_etf"] if isinstance(sym["subsector_etf"], str) else None,
        "years": years,
        "from": str(start),
        "to": str(end),
        "rows": len(cols),
    }
    assert doc["_metadata"] == snap.metadata()
    # The simple returns match the prices they come from where the day before is priced.
    price = snap.array("price_close")[row]
    prev_ok = cols[(cols > 0) & np.isfinite(price[np.maximum(cols - 1, 0)])]
    gross = snap.array("return")[row, prev_ok]
    np.testing.assert_allclose(gross, price[prev_ok] / price[prev_ok - 1] - 1, rtol=1e-12)


def test_years_window_is_sessions_after_data_as_of_minus_n_years(client, snap):
    doc = client.get("/api/ticker-returns?ticker=NVDA", headers=AUTH).json()
    assert doc["meta"]["years"] == 1  # the default
    as_of = date.fromisoformat(snap.manifest["data_as_of"])
    assert doc["data"][-1]["date"] == str(as_of)
    first = date.fromisoformat(doc["data"][0]["date"])
    assert first > as_of.replace(year=as_of.year - 1)
    before = snap.sessions[snap.sessions <= np.datetime64(as_of.replace(year=as_of.year - 1))]
    assert np.datetime64(first) == snap.sessions[len(before)]
    # A late listing answers its priced sessions only; the whole history is the maximum.
    late = client.get("/api/ticker-returns?ticker=CRVR&years=13", headers=AUTH).json()
    assert late["data"][0]["date"] == str(snap.symbols.loc["CRVR", "first_teo"])


def test_halted_sessions_are_left_out_not_filled(client, snap):
    doc = client.get("/api/returns?ticker=DST&years=13", headers=AUTH).json()
    _, cols = window(snap, "DST", years_start(snap, 13), date(2100, 1, 1))
    assert doc["meta"]["rows"] == len(cols) < len(snap.sessions)
    assert len(doc["data"]) == len(cols)


@pytest.mark.parametrize("route", ["ticker-returns", "returns", "l3-decomposition"])
def test_a_delisted_symbol_without_prices_in_the_range_is_no_data_and_says_why(client, snap, route):
    body = assert_problem(client.get(f"/api/{route}?ticker=TAIS", headers=AUTH), 404, "NO_DATA")
    assert body["ticker"] == "TAIS" and body["priced_to"] == "2024-08-16"
    assert body["priced_from"] == str(snap.symbols.loc["TAIS", "first_teo"])[:10]
    assert "2024-08-16" in body["detail"] and "overlaps its history" in body["detail"]
    estimate = _estimate(client, route, {"ticker": "TAIS"})
    assert (estimate.status_code, estimate.json()["detail"]) == (404, body["detail"])
    longer = client.get("/api/ticker-returns?ticker=TAIS&years=5", headers=AUTH).json()
    assert longer["data"][-1]["date"] == "2024-08-16"


def test_metrics_of_a_delisted_symbol_say_it_is_stale(client, snap):
    doc = client.get("/api/metrics/TAIS", headers=AUTH).json()
    last = int(np.flatnonzero(snap.sessions == np.datetime64("2024-08-16"))[0])
    assert doc["teo"] == doc["last_session"] == "2024-08-16"
    assert doc["stale"] is True
    assert doc["sessions_behind"] == len(snap.sessions) - 1 - last > 500
    fresh = client.get("/api/metrics/NVDA", headers=AUTH).json()
    assert fresh["stale"] is False and fresh["sessions_behind"] == 0
    assert fresh["last_session"] == snap.manifest["data_as_of"]
    batch = client.post(
        "/api/batch/analyze",
        json={"tickers": ["TAIS", "NVDA"], "metrics": ["full_metrics"]},
        headers=AUTH,
    ).json()
    assert batch["results"]["TAIS"]["full_metrics"]["sessions_behind"] == doc["sessions_behind"]
    assert batch["results"]["TAIS"]["full_metrics"]["stale"] is True


def test_heatmap_rows_say_how_far_behind_their_values_are(client, snap):
    rows = client.get("/api/heatmap?limit=500", headers=AUTH).json()["data"]
    index = {str(d)[:10]: i for i, d in enumerate(snap.sessions)}
    for r in rows:
        assert r["sessions_behind"] == len(snap.sessions) - 1 - index[r["teo"]]
        assert r["stale"] is (r["sessions_behind"] > 0)


def test_a_batch_ticker_without_prices_in_the_window_fails_alone_and_is_not_charged(client):
    body = {"tickers": ["TAIS", "NVDA"], "years": 1}
    doc = client.post("/api/batch/analyze", json=body, headers=AUTH).json()
    assert doc["results"]["TAIS"]["status"] == "error"
    assert doc["results"]["TAIS"]["code"] == "NO_DATA"  # issue 13: error is the sentence
    assert doc["results"]["NVDA"]["status"] == "success"
    assert doc["summary"] == {"total": 2, "succeeded": 1, "failed": 1}
    assert "1 of 2" in _estimate(client, "batch/analyze", body).json()["note"]


def test_a_repeated_parameter_is_400_on_service_b_too(client):
    body = assert_problem(
        client.get("/api/ticker-returns?ticker=NVDA&ticker=AAPL", headers=AUTH),
        400,
        "INVALID_PARAMETER",
    )
    assert body["parameters"] == ["ticker"] and "more than once" in body["detail"]
    missing = client.get("/api/ticker-returns?tickr=NVDA", headers=AUTH).json()
    assert missing["error"] == "INVALID_PARAMETER" and missing["parameters"] == ["tickr"]


@pytest.mark.parametrize("ticker", TICKERS)
def test_returns_and_etf_returns_serve_their_asset_type(client, snap, ticker):
    route = _route_for(snap, ticker)
    resp = client.get(f"/api/{route}?ticker={ticker}&years=2", headers=AUTH)
    doc = resp.json()
    row, cols = window(snap, ticker, years_start(snap, 2), date(2100, 1, 1))
    assert list(doc["data"][0]) == ["date", "returns_gross"]
    got = floats([r["returns_gross"] for r in doc["data"]])
    assert np.array_equal(got, snap.array("return")[row, cols], equal_nan=True)
    other = "etf-returns" if route == "returns" else "returns"
    body = assert_problem(
        client.get(f"/api/{other}?ticker={ticker}", headers=AUTH), 400, "INVALID_PARAMETER"
    )
    assert f"/api/{route}" in body["detail"] and body["use"] == f"/api/{route}"


def test_etf_returns_also_takes_etf(client):
    a = client.get("/api/etf-returns?etf=xlk&years=3", headers=AUTH).json()
    b = client.get("/api/etf-returns?ticker=XLK&years=3", headers=AUTH).json()
    assert a == b and a["meta"]["ticker"] == "XLK"


@pytest.mark.parametrize("ticker", ["NVDA", "AAPL", "SPY"])
def test_l3_decomposition_defaults_to_one_year_and_equals_the_arrays(client, snap, ticker):
    doc = client.get(f"/api/l3-decomposition?ticker={ticker}", headers=AUTH).json()
    ref = client.get(f"/api/ticker-returns?ticker={ticker}&years=1", headers=AUTH).json()
    assert [r["date"] for r in doc["data"]] == [r["date"] for r in ref["data"]]
    assert doc["meta"]["from"] == ref["meta"]["from"] and "years" not in doc["meta"]
    resp = client.get(
        f"/api/l3-decomposition?ticker={ticker}&from=2019-02-01&to=2020-06-30", headers=AUTH
    )
    doc = resp.json()
    row, cols = window(snap, ticker, date(2019, 2, 1), date(2020, 6, 30))
    assert doc["data"][0]["date"] >= "2019-02-01" and doc["data"][-1]["date"] <= "2020-06-30"
    assert list(doc["data"][0]) == ["date", *fields.L3_COLUMNS]
    for name in fields.L3_COLUMNS:
        got = floats([r[name] for r in doc["data"]])
        assert np.array_equal(got, snap.array(name)[row, cols], equal_nan=True), name
    assert doc["meta"]["rows"] == len(cols)


def test_l3_decomposition_before_the_history_is_empty_and_says_so(client):
    doc = client.get(
        "/api/l3-decomposition?ticker=NVDA&from=2000-01-01&to=2001-01-01", headers=AUTH
    ).json()
    assert doc["data"] == [] and doc["meta"]["rows"] == 0 and doc["meta"]["note"]


@pytest.mark.parametrize("ticker", ["NVDA", "AAPL", "SPY", "XLK", "DST"])
def test_risk_shares_of_every_row_sum_to_one(client, ticker):
    doc = client.get(f"/api/ticker-returns?ticker={ticker}&years=13", headers=AUTH).json()
    levels = {
        "l1": ["l1_mkt_er", "l1_res_er"],
        "l2": ["l2_mkt_er", "l2_sec_er", "l2_res_er"],
        "l3": ["l3_mkt_er", "l3_sec_er", "l3_sub_er", "l3_res_er"],
    }
    published = 0
    for row in doc["data"]:
        for names in levels.values():
            shares = [row[n] for n in names if row[n] is not None]
            if row[names[-1]] is None:  # no residual: nothing published at this level
                continue
            assert abs(sum(shares) - 1.0) < 1e-9, (row["date"], names, shares)
            assert all(-1e-9 <= s <= 1 + 1e-9 for s in shares)
            published += 1
    assert published > 0


# --------------------------------------------------------------------------- formats


def _csv_rows(body: bytes, columns: list[str]) -> dict[str, list[Any]]:
    types = {c: pa.float64() for c in columns}
    types["date"] = pa.date32()
    table = pacsv.read_csv(
        io.BytesIO(body), convert_options=pacsv.ConvertOptions(column_types=types)
    )
    return table.to_pydict()


@pytest.mark.parametrize(
    ("url", "stem"),
    [
        ("/api/ticker-returns?ticker=NVDA&years=5", "NVDA_ticker-returns_5y"),
        ("/api/ticker-returns?ticker=AAPL&years=2", "AAPL_ticker-returns_2y"),
        ("/api/returns?ticker=DST&years=13", "DST_returns_13y"),
        ("/api/etf-returns?ticker=SPY", "SPY_etf-returns_1y"),
        (
            "/api/l3-decomposition?ticker=AAPL&from=2020-01-01&to=2020-12-31",
            "AAPL_l3-decomposition_2020-01-01_2020-12-31",
        ),
    ],
)
def test_csv_and_parquet_hold_the_same_rows_as_json(client, snap, url, stem):
    data = client.get(url, headers=AUTH).json()["data"]
    columns = list(data[0])
    expected = {c: [r[c] for r in data] for c in columns}
    expected["date"] = [date.fromisoformat(d) for d in expected["date"]]

    csv = client.get(url + "&format=csv", headers=AUTH)
    assert csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert csv.headers["content-disposition"] == f'attachment; filename="{stem}.csv"'
    assert_from_snapshot(csv, snap)
    assert csv.content.splitlines()[0].decode().replace('"', "").split(",") == columns
    got = _csv_rows(csv.content, columns)
    assert got == expected  # null <-> empty cell, every float exact

    parquet = client.get(url + "&format=parquet", headers=AUTH)
    assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
    assert parquet.headers["content-disposition"] == f'attachment; filename="{stem}.parquet"'
    assert_from_snapshot(parquet, snap)
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.column_names == columns
    assert table.schema.field("date").type == pa.date32()
    assert table.to_pydict() == expected


def test_accept_header_picks_the_format_and_the_parameter_wins(client):
    url = "/api/returns?ticker=NVDA"
    assert (
        client.get(url, headers={**AUTH, "Accept": "text/csv"})
        .headers["content-type"]
        .startswith("text/csv")
    )
    pq_resp = client.get(url, headers={**AUTH, "Accept": "application/vnd.apache.parquet"})
    assert pq_resp.headers["content-type"] == "application/vnd.apache.parquet"
    json_resp = client.get(url + "&format=JSON", headers={**AUTH, "Accept": "text/csv"})
    assert json_resp.headers["content-type"] == "application/json"


def test_etag_answers_304_when_unchanged(client, snap):
    url = "/api/ticker-returns?ticker=NVDA&years=3"
    first = client.get(url, headers=AUTH)
    etag = first.headers["etag"]
    again = client.get(url, headers={**AUTH, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag
    assert_from_snapshot(again, snap)
    assert again.headers["x-request-id"]
    # Same request spelled differently: same representation, same tag.
    same = client.get("/api/ticker-returns?years=3&ticker=nvda", headers=AUTH)
    assert same.headers["etag"] == etag
    # Another format, range or ticker: another tag, and a full answer.
    for other in (
        url + "&format=csv",
        url.replace("years=3", "years=4"),
        url.replace("NVDA", "AAPL"),
    ):
        resp = client.get(other, headers={**AUTH, "If-None-Match": etag})
        assert resp.status_code == 200 and resp.headers["etag"] != etag
    l3 = client.get("/api/l3-decomposition?ticker=NVDA", headers=AUTH)
    assert (
        client.get(
            "/api/l3-decomposition?ticker=NVDA",
            headers={**AUTH, "If-None-Match": l3.headers["etag"]},
        ).status_code
        == 304
    )


# --------------------------------------------------------------------------- heatmap, batch


def test_heatmap_is_the_largest_stocks_by_market_cap(client, snap):
    doc = client.get("/api/heatmap", headers=AUTH).json()
    assert len(doc["data"]) == HEATMAP_DEFAULT == doc["meta"]["rows"]
    caps = [r["market_cap"] for r in doc["data"]]
    assert caps == sorted(caps, reverse=True)
    as_of = snap.manifest["data_as_of"]
    stocks = snap.symbols[
        (snap.symbols["asset_type"] == "stock") & (snap.symbols["latest_teo"].astype(str) == as_of)
    ]
    top = stocks.sort_values("latest_market_cap", ascending=False)["ticker"][:50].tolist()
    assert [r["ticker"] for r in doc["data"]] == top
    for r in doc["data"][:10]:
        row = int(snap.symbols.loc[r["ticker"], "row"])
        assert r["market_cap"] == snap.array("market_cap")[row, -1]
        assert floats([r["return_1d"]])[0] == snap.array("return")[row, -1]
        assert r["teo"] == as_of
        assert r["company_name"] == snap.symbols.loc[r["ticker"], "name"]
        assert r["industry"] == snap.symbols.loc[r["ticker"], "gics_sub_industry"]
    three = client.get("/api/heatmap?limit=3", headers=AUTH).json()["data"]
    assert three == doc["data"][:3]
    assert (
        len(client.get("/api/heatmap?limit=500", headers=AUTH).json()["data"])
        == (doc["meta"]["eligible"])
    )


def test_batch_answers_each_ticker_and_a_bad_one_fails_alone(client, snap):
    body = {"tickers": ["nvda", "SPY", "NOPE", "NVDA", "aapl"], "years": 2}
    resp = client.post("/api/batch/analyze", json=body, headers=AUTH)
    doc = resp.json()
    assert list(doc["results"]) == ["NVDA", "SPY", "NOPE", "AAPL"]
    assert doc["summary"] == {"total": 4, "succeeded": 3, "failed": 1}
    assert doc["results"]["NOPE"]["status"] == "error"
    assert doc["results"]["NOPE"]["code"] == "TICKER_NOT_FOUND"  # issue 13: error is a string
    assert "NOPE" in doc["results"]["NOPE"]["error"]
    assert doc["meta"]["metrics"] == ["returns", "hedge_ratios"]  # the default
    assert doc["_metadata"] == snap.metadata()
    assert_from_snapshot(resp, snap)
    for ticker in ("NVDA", "SPY", "AAPL"):
        item = doc["results"][ticker]
        assert item["status"] == "success" and "full_metrics" not in item
        ref = client.get(f"/api/ticker-returns?ticker={ticker}&years=2", headers=AUTH).json()
        # issue 13: column-wise returns carrying the L3 hedge-ratio series
        assert item["returns"]["dates"] == [r["date"] for r in ref["data"]]
        assert item["returns"]["values"] == [r["returns_gross"] for r in ref["data"]]
        assert item["returns"]["l3_sector_hr"] == [r["l3_sec_hr"] for r in ref["data"]]


def test_batch_full_metrics_equals_the_metrics_route(client):
    body = {"tickers": ["NVDA", "XLK"], "metrics": ["full_metrics"]}
    doc = client.post("/api/batch/analyze", json=body, headers=AUTH).json()
    for ticker in ("NVDA", "XLK"):
        item = doc["results"][ticker]
        assert set(item) == {"status", "ticker", "full_metrics", "hedge_levels", "meta"}
        metrics = client.get(f"/api/metrics/{ticker}", headers=AUTH).json()
        # issue 13: full_metrics is flat (the metrics plus ticker and date = teo)
        assert item["full_metrics"] == {
            "ticker": ticker,
            "date": metrics["teo"],
            "teo": metrics["teo"],
            **metrics["metrics"],
            "stale": metrics["stale"],
            "sessions_behind": metrics["sessions_behind"],
        }
        assert item["hedge_levels"] == metrics["hedge_levels"]


# --------------------------------------------------------------------------- estimate


def _estimate(client: TestClient, endpoint: str, params: dict[str, Any]) -> Any:
    return client.post("/api/estimate", json={"endpoint": endpoint, "params": params}, headers=AUTH)


@pytest.mark.parametrize(
    ("endpoint", "params", "usd", "tokens"),
    [
        ("ticker-returns", {"ticker": "NVDA", "years": 5}, 0.005, 250),
        ("/api/ticker-returns", {"ticker": "SPY"}, 0.005, 250),
        ("returns", {"ticker": "NVDA"}, 0.005, 250),
        ("etf-returns", {"etf": "XLK", "format": "parquet"}, 0.005, 250),
        ("metrics", {"ticker": "NVDA"}, 0.005, 250),
        ("/api/metrics/nvda", {}, 0.005, 250),
        ("heatmap", {"limit": 10}, 0.005, 250),
        ("l3-decomposition", {"ticker": "NVDA", "from": "2020-01-01"}, 0.01, 500),
        ("tickers", {"search": "bank"}, 0.0, 0),
        ("batch/analyze", {"tickers": ["NVDA", "AAPL", "MSFT", "NOPE"]}, 0.01, 500),
        ("batch/analyze", {"tickers": ["NVDA", "AAPL", "MSFT", "nvda"]}, 0.01, 500),
        (
            "batch/analyze",
            {"tickers": ["NVDA", "AAPL", "MSFT", "TSLA", "META", "AMZN"]},
            0.012,
            600,
        ),
        ("batch/analyze", {"tickers": ["NOPE", "NADA"]}, 0.0, 0),
    ],
)
def test_estimate_equals_the_price_table(client, snap, endpoint, params, usd, tokens):
    resp = _estimate(client, endpoint, params)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["estimated_cost_usd"] == usd
    assert doc["estimated_tokens"] == tokens
    assert doc["estimated_bytes"] > 0
    assert doc["_metadata"] == snap.metadata()
    assert set(doc) >= {"endpoint", "unit_cost_usd", "pricing_model", "note", "estimated_rows"}
    prices = PriceTable.load()
    assert doc["unit_cost_usd"] == prices[doc["endpoint"]].usd


def test_batch_estimate_is_three_good_tickers_at_the_minimum(snap):
    prices = PriceTable.load()
    priced_on, doc = estimate(
        "batch/analyze",
        {"tickers": ["NVDA", "AAPL", "MSFT", "BAD1"]},
        lambda version: snap,
        prices,
        ESTIMATED,
    )
    assert priced_on is snap
    batch = prices["batch/analyze"]
    assert doc["estimated_tokens"] == batch.cost(3) == max(3 * 100, 500)
    assert doc["estimated_cost_usd"] == max(3 * 0.002, 0.01)
    assert doc["pricing_model"].startswith("per_ticker")


def test_estimate_rows_match_the_real_answer(client):
    cases = [
        ("ticker-returns", {"ticker": "NVDA", "years": 5}),
        ("returns", {"ticker": "DST", "years": 13}),
        ("l3-decomposition", {"ticker": "AAPL", "from": "2019-05-05", "to": "2021-01-01"}),
        ("heatmap", {"limit": 7}),
    ]
    for endpoint, params in cases:
        doc = _estimate(client, endpoint, params).json()
        real = client.get(f"/api/{endpoint}", params=params, headers=AUTH).json()
        assert doc["estimated_rows"] == len(real["data"]), endpoint
    body = {"tickers": ["NVDA", "SPY", "NOPE"], "metrics": ["returns", "full_metrics"]}
    doc = _estimate(client, "batch/analyze", body).json()
    real = client.post("/api/batch/analyze", json=body, headers=AUTH).json()
    rows = sum(
        len(r.get("returns", {}).get("dates", [])) + ("full_metrics" in r)
        for r in real["results"].values()
    )
    assert doc["estimated_rows"] == rows


def test_estimate_uses_the_operators_price_table(demo_settings, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"ticker-returns": {"usd": 0.004}}))
    app = create_app(demo_settings.model_copy(update={"pricing_file": prices}))
    doc = _estimate(TestClient(app), "ticker-returns", {"ticker": "NVDA"}).json()
    assert doc["estimated_tokens"] == 200 and doc["estimated_cost_usd"] == 0.004


# --------------------------------------------------------------------------- errors

ERROR_CASES = [
    # (method, url, json body, status, code)
    ("GET", "/api/ticker-returns", None, 400, "MISSING_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&years=0", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&years=31", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&years=14", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&years=two", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&format=xml", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDA&yeras=2", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/ticker-returns?ticker=NVDAX", None, 404, "TICKER_NOT_FOUND"),
    ("GET", "/api/ticker-returns?ticker=%20", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/returns?ticker=SPY", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/returns?ticker=ZZZZ", None, 404, "TICKER_NOT_FOUND"),
    ("GET", "/api/etf-returns", None, 400, "MISSING_PARAMETER"),
    ("GET", "/api/etf-returns?ticker=NVDA", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/etf-returns?ticker=SPY&etf=XLK", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/l3-decomposition?ticker=NVDA&from=2024-02-30", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/l3-decomposition?ticker=NVDA&from=20240101", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/l3-decomposition?ticker=NVDA&to=yesterday", None, 400, "INVALID_PARAMETER"),
    (
        "GET",
        "/api/l3-decomposition?ticker=NVDA&from=2026-01-01&to=2025-01-01",
        None,
        400,
        "INVALID_PARAMETER",
    ),
    ("GET", "/api/l3-decomposition?ticker=NVDA&from=2030-01-01", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/l3-decomposition?from=2020-01-01", None, 400, "MISSING_PARAMETER"),
    ("GET", "/api/l3-decomposition?ticker=NOPE", None, 404, "TICKER_NOT_FOUND"),
    ("GET", "/api/heatmap?limit=0", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/heatmap?limit=501", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/heatmap?limit=ten", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/tickers?array=symbol", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/tickers?asset_type=bond", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/tickers?search=", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/tickers?mag7=maybe", None, 400, "INVALID_PARAMETER"),
    ("GET", "/api/metrics/NOPE", None, 404, "TICKER_NOT_FOUND"),
    ("GET", "/api/metrics/NVDA?years=2", None, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", {}, 400, "MISSING_PARAMETER"),
    ("POST", "/api/batch/analyze", {"tickers": []}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", {"tickers": "NVDA"}, 400, "INVALID_PARAMETER"),
    (
        "POST",
        "/api/batch/analyze",
        {"tickers": [f"T{i}" for i in range(101)]},
        400,
        "INVALID_PARAMETER",
    ),
    (
        "POST",
        "/api/batch/analyze",
        {"tickers": ["NVDA"], "metrics": ["pe"]},
        400,
        "INVALID_PARAMETER",
    ),
    ("POST", "/api/batch/analyze", {"tickers": ["NVDA"], "metrics": []}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", {"tickers": ["NVDA"], "years": 0}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", {"tickers": ["NVDA"], "years": 14}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", {"tickers": ["NVDA"], "period": 1}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/batch/analyze", ["NVDA"], 400, "INVALID_PARAMETER"),
    ("POST", "/api/estimate", {"endpoint": "prices"}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/estimate", {"params": {}}, 400, "MISSING_PARAMETER"),
    ("POST", "/api/estimate", {"endpoint": "heatmap", "params": []}, 400, "INVALID_PARAMETER"),
    ("POST", "/api/estimate", {"endpoint": "heatmap", "extra": 1}, 400, "INVALID_PARAMETER"),
    ("GET", "/api/no-such-route", None, 404, "NOT_FOUND"),
    ("GET", "/api/estimate", None, 405, "METHOD_NOT_ALLOWED"),
]


@pytest.mark.parametrize(("method", "url", "body", "status", "code"), ERROR_CASES)
def test_errors_have_the_problem_shape_and_code(client, method, url, body, status, code):
    resp = client.request(method, url, json=body, headers=AUTH)
    assert_problem(resp, status, code)


def test_errors_say_what_is_accepted(client):
    def problem(url: str) -> dict[str, Any]:
        return client.get(url, headers=AUTH).json()

    unknown = problem("/api/ticker-returns?ticker=NVDA&yeras=2")
    assert unknown["parameters"] == ["yeras"]
    # issue 13: csv_comment, and the real service's limit and nocache, are accepted too
    assert unknown["accepted"] == [
        *("ticker", "years", "start", "end", "format", "csv_comment", "limit", "nocache"),
        "version",
    ]
    beyond = problem("/api/ticker-returns?ticker=NVDA&years=14")
    assert beyond["maximum"] == 13 and "1 to 13" in beyond["detail"]
    assert "'json', 'csv' or 'parquet'" in problem("/api/returns?ticker=NVDA&format=xml")["detail"]
    missing = problem("/api/ticker-returns")
    assert missing["parameters"] == ["ticker"]
    near = problem("/api/ticker-returns?ticker=NVDX")
    assert near["ticker"] == "NVDX" and near["suggestions"][0] == "NVDA"
    assert "NVDX" in near["detail"] and "NVDA" in near["detail"]
    assert "YYYY-MM-DD" in problem("/api/l3-decomposition?ticker=NVDA&from=2024-02-30")["detail"]
    assert (
        "from"
        in problem("/api/l3-decomposition?ticker=NVDA&from=2026-01-01&to=2025-01-01")["detail"]
    )
    extra = client.post(
        "/api/batch/analyze", json={"tickers": ["NVDA"], "period": 1}, headers=AUTH
    ).json()
    assert "period" in extra["detail"] and "tickers, metrics, years" in extra["detail"]
    endpoint = client.post("/api/estimate", json={"endpoint": "prices"}, headers=AUTH).json()
    assert endpoint["accepted"] == list(ESTIMATED)


def test_malformed_and_non_json_bodies_are_4xx(client):
    for url in ("/api/batch/analyze", "/api/estimate"):
        bad = client.post(
            url, content=b'{"tickers": [', headers={**AUTH, "Content-Type": "application/json"}
        )
        assert "not valid JSON" in assert_problem(bad, 400, "INVALID_PARAMETER")["detail"]
        text = client.post(
            url, content=b"tickers=NVDA", headers={**AUTH, "Content-Type": "text/plain"}
        )
        assert assert_problem(text, 415, "UNSUPPORTED_MEDIA_TYPE")["accepted"] == [
            "application/json"
        ]
        form = client.post(url, data={"tickers": "NVDA"}, headers=AUTH)
        assert_problem(form, 415, "UNSUPPORTED_MEDIA_TYPE")
        empty = client.post(url, content=b"", headers={**AUTH, "Content-Type": "application/json"})
        assert_problem(empty, 400, "MISSING_PARAMETER")


PARITY_CASES = [
    ("ticker-returns", {}),
    ("ticker-returns", {"ticker": "NVDA", "years": 0}),
    ("ticker-returns", {"ticker": "NVDA", "years": 14}),
    ("ticker-returns", {"ticker": "NVDA", "yeras": 2}),
    ("ticker-returns", {"ticker": "NVDA", "format": "xml"}),
    ("ticker-returns", {"ticker": "NVDAX"}),
    ("returns", {"ticker": "SPY"}),
    ("etf-returns", {}),
    ("etf-returns", {"ticker": "NVDA"}),
    ("etf-returns", {"ticker": "SPY", "etf": "XLK"}),
    ("l3-decomposition", {"ticker": "NVDA", "from": "2024-02-30"}),
    ("l3-decomposition", {"ticker": "NVDA", "from": "2026-01-01", "to": "2025-01-01"}),
    ("l3-decomposition", {"ticker": "NOPE"}),
    ("heatmap", {"limit": 0}),
    ("heatmap", {"limit": 501}),
    ("tickers", {"array": "symbol"}),
    ("tickers", {"asset_type": "bond"}),
    ("ticker-returns", {"ticker": "TAIS"}),
    ("l3-decomposition", {"ticker": "TAIS", "from": "2025-01-01"}),
]


@pytest.mark.parametrize(("endpoint", "params"), PARITY_CASES)
def test_estimate_refuses_what_the_route_refuses(client, endpoint, params):
    route = client.get(f"/api/{endpoint}", params=params, headers=AUTH)
    estimate = _estimate(client, endpoint, params)
    assert route.status_code >= 400
    assert (estimate.status_code, estimate.json()["error"]) == (
        route.status_code,
        route.json()["error"],
    )


def test_estimate_of_an_unknown_ticker_is_404_and_batch_is_validated(client):
    assert_problem(_estimate(client, "metrics", {"ticker": "NOPE"}), 404, "TICKER_NOT_FOUND")
    assert_problem(_estimate(client, "metrics/NOPE", {}), 404, "TICKER_NOT_FOUND")
    body = assert_problem(
        _estimate(client, "batch/analyze", {"tickers": ["NVDA"], "metrics": ["pe"]}),
        400,
        "INVALID_PARAMETER",
    )
    assert body["parameters"] == ["params.metrics.0"]
    assert_problem(_estimate(client, "batch/analyze", {"tickers": []}), 400, "INVALID_PARAMETER")


def test_request_id_on_every_answer_and_echoed_when_given(client):
    for resp in (
        client.get("/api/health"),
        client.get("/api/tickers", headers=AUTH),
        client.get("/api/tickers"),
        client.get("/api/nothing-here", headers=AUTH),
        client.get("/api/metrics/NOPE", headers=AUTH),
        client.get("/api/returns?ticker=NVDA&format=csv", headers=AUTH),
    ):
        assert len(resp.headers["x-request-id"]) >= 16
    given = client.get("/api/metrics/NOPE", headers={**AUTH, "X-Request-ID": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42" == given.json()["request_id"]


# --------------------------------------------------------------------------- snapshots


def test_no_snapshot_is_503_not_500(tmp_path):
    register_key(tmp_path)
    client = TestClient(create_app(Settings(home=tmp_path, _env_file=None)))
    assert_problem(client.get("/api/health"), 503, "SERVICE_UNAVAILABLE")
    assert_problem(client.get("/api/tickers", headers=AUTH), 503, "SERVICE_UNAVAILABLE")


def test_a_new_snapshot_is_served_without_restart(demo_home, tmp_path):
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.model.run import ModelParams

    home = tmp_path / "home"
    shutil.copytree(demo_home / "ingested", home / "ingested")
    first = build_snapshot(home, ModelParams())
    register_key(home)
    client = TestClient(create_app(Settings(home=home, _env_file=None)))
    headers = AUTH
    url = "/api/ticker-returns?ticker=NVDA&years=2"
    before = client.get(url, headers=headers)
    assert before.json()["_metadata"]["model_version"] == first["model_version"]
    assert before.json()["_metadata"]["method"]["window"] == 252

    second = build_snapshot(home, ModelParams(window=126, min_obs=63))
    assert second["model_version"] != first["model_version"]
    after = client.get(url, headers=headers)
    doc = after.json()
    assert doc["_metadata"]["model_version"] == second["model_version"]
    assert after.headers["x-model-version"] == second["model_version"]
    assert doc["_metadata"]["method"]["window"] == 126
    assert doc["data"] != before.json()["data"]  # new estimates, same prices
    assert [r["returns_gross"] for r in doc["data"]] == [
        r["returns_gross"] for r in before.json()["data"]
    ]
    # The old tag no longer matches: a cached copy is refreshed.
    stale = client.get(url, headers={**headers, "If-None-Match": before.headers["etag"]})
    assert stale.status_code == 200
    assert client.get("/api/health").json()["model_version"] == second["model_version"]


def test_docs_page_works_offline(client):
    page = client.get("/docs")
    assert page.status_code == 200
    html = page.text
    assert "cdn." not in html and "https://" not in html.replace("https://swagger.io", "")
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        url = html.split(asset)[0].rsplit('"', 1)[1] + asset
        assert url.startswith("/")
        assert client.get(url).status_code == 200
    assert client.get("/openapi.json").json()["info"]["title"] == "eqrisk"
