"""Contract tests of Service B against the real service's wire format (issue 13).

Written from ../shared/docs/SERVICE-B-WIRE.md: each route answers the request and response
shapes that code written against the real Service B (RiskModels V2) reads, and every value is
checked against eqrisk's own answers or the snapshot's arrays.
"""

from __future__ import annotations

import io
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from eqrisk.snapshot.index import minus_years
from eqrisk.snapshot.versions import Snapshot, SnapshotStore
from helpers import TEST_KEY

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
DEMO = {"Authorization": "Bearer eqrisk-demo"}
L3_LONG = {
    "l3_market_hr": "l3_mkt_hr",
    "l3_sector_hr": "l3_sec_hr",
    "l3_subsector_hr": "l3_sub_hr",
    "l3_market_er": "l3_mkt_er",
    "l3_sector_er": "l3_sec_er",
    "l3_subsector_er": "l3_sub_er",
    "l3_residual_er": "l3_res_er",
}


@pytest.fixture(scope="module")
def client(demo_settings: Settings) -> TestClient:
    return TestClient(create_app(demo_settings))


@pytest.fixture(scope="module")
def snap(demo_home: Path) -> Snapshot:
    return SnapshotStore(demo_home).current()


def get(client: TestClient, url: str, **params: Any) -> Any:
    resp = client.get(url, params=params or None, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp


def batch(client: TestClient, body: dict[str, Any], headers: dict[str, str] = AUTH) -> Any:
    resp = client.post("/api/batch/analyze", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp


# --------------------------------------------------------------------------- §2, §3


def test_errors_carry_the_sentence_as_message(client):
    for url in ("/api/metrics/NOPEX", "/api/ticker-returns?ticker=NVDA&yeras=2"):
        body = client.get(url, headers=AUTH).json()
        assert body["message"] == body["detail"] and len(body["message"]) > 20
        assert body["error"] in ("TICKER_NOT_FOUND", "INVALID_PARAMETER")
    missing = client.get("/api/metrics/NVDA").json()
    assert missing["message"] == missing["detail"] and missing["status"] == 401


def test_every_answer_names_the_model_version_under_both_headers(client, snap):
    urls = [
        "/api/tickers?search=AAPL",
        "/api/metrics/NVDA",
        "/api/l3-decomposition?ticker=NVDA",
        "/api/ticker-returns?ticker=NVDA&format=parquet",
        "/api/ticker-returns?ticker=NVDA&format=csv",
    ]
    for url in urls:
        resp = get(client, url)
        assert resp.headers["X-Risk-Model-Version"] == snap.version, url
        assert resp.headers["X-Model-Version"] == snap.version, url
        assert resp.headers["X-Data-As-Of"] == str(snap.manifest["data_as_of"])
        assert resp.headers["X-Universe-Size"] == str(snap.manifest["universe_size"])


# --------------------------------------------------------------------------- §5 tickers


def test_ticker_search_puts_its_hits_under_tickers(client):
    doc = get(client, "/api/tickers", search="nvidia").json()
    assert doc["tickers"] == doc["results"] and doc["tickers"][0]["ticker"] == "NVDA"
    assert doc["count"] == len(doc["tickers"])


def test_include_metadata_answers_rows_with_the_hedge_etfs(client):
    rows = get(client, "/api/tickers", mag7="true", include_metadata="true").json()["tickers"]
    assert [r["ticker"] for r in rows] == ["AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "META", "TSLA"]
    for row in rows:
        meta = get(client, f"/api/metrics/{row['ticker']}").json()["meta"]
        assert {k: row[k] for k in meta} == meta
    plain = get(client, "/api/tickers", mag7="true").json()["tickers"]
    assert plain == [r["ticker"] for r in rows]
    hits = get(client, "/api/tickers", search="nvda", include_metadata="true").json()["tickers"]
    assert hits[0]["ticker"] == "NVDA" and hits[0]["subsector_etf"] is not None


# --------------------------------------------------------------------------- §4, §6 metrics


def test_metrics_carry_hedge_levels_built_from_the_flat_values(client):
    doc = get(client, "/api/metrics/NVDA").json()
    m, meta, levels = doc["metrics"], doc["meta"], doc["hedge_levels"]
    assert levels["L1"] == {
        "market_hr": m["l1_mkt_hr"],
        "sector_hr": None,
        "subsector_hr": None,
        "market_er": m["l1_mkt_er"],
        "sector_er": None,
        "subsector_er": None,
        "residual_er": m["l1_res_er"],
        "hedge_etfs": {"market": meta["market_etf"], "sector": None, "subsector": None},
    }
    assert levels["L2"]["sector_hr"] == m["l2_sec_hr"] and levels["L2"]["subsector_hr"] is None
    assert levels["L2"]["hedge_etfs"]["sector"] == meta["sector_etf"] is not None
    l3 = levels["L3"]
    assert [l3[k] for k in ("market_hr", "sector_hr", "subsector_hr")] == [
        m["l3_mkt_hr"],
        m["l3_sec_hr"],
        m["l3_sub_hr"],
    ]
    shares = [l3[k] for k in ("market_er", "sector_er", "subsector_er", "residual_er")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    assert l3["hedge_etfs"] == {
        "market": meta["market_etf"],
        "sector": meta["sector_etf"],
        "subsector": meta["subsector_etf"],
    }
    assert levels["recommended_level"] == "L3"
    # L*: the level with the least out-of-sample residual share, the simpler one on a tie
    hq = [m["l1_hq"], m["l2_hq"], m["l3_hq"]]
    assert levels["statistical_lstar"] == f"L{hq.index(min(hq)) + 1}"
    # the per-level betas: the hedge ratio of the ETF each level adds
    assert m["l1_mkt_beta"] == m["l1_mkt_hr"]
    assert m["l2_sec_beta"] == m["l2_sec_hr"]
    assert m["l3_sub_beta"] == m["l3_sub_hr"]


def test_a_stock_without_subsector_etf_stops_at_l2(client):
    doc = get(client, "/api/metrics/AAPL").json()
    assert doc["meta"]["subsector_etf"] is None
    assert set(doc["hedge_levels"]) == {"L1", "L2", "statistical_lstar", "recommended_level"}
    assert doc["hedge_levels"]["recommended_level"] == "L2"
    assert doc["hedge_levels"]["statistical_lstar"] in ("L1", "L2")


# --------------------------------------------------------------------------- §7 ticker-returns


def test_limit_answers_the_most_recent_rows_and_is_estimated_by_them(client):
    full = get(client, "/api/ticker-returns", ticker="NVDA", years=2).json()
    cut = get(client, "/api/ticker-returns", ticker="NVDA", years=2, limit=5).json()
    assert cut["data"] == full["data"][-5:]
    assert cut["asset_type"] == cut["meta"]["asset_type"] == "stock"
    more = get(client, "/api/ticker-returns", ticker="NVDA", years=2, limit=100000).json()
    assert more["data"] == full["data"]
    body = {"endpoint": "ticker-returns", "params": {"ticker": "NVDA", "years": 2, "limit": 5}}
    est = client.post("/api/estimate", json=body, headers=AUTH).json()
    assert est["estimated_rows"] == 5
    parquet = get(client, "/api/ticker-returns", ticker="NVDA", years=2, limit=5, format="parquet")
    assert pq.read_table(io.BytesIO(parquet.content)).num_rows == 5
    bad = client.get("/api/ticker-returns?ticker=NVDA&limit=0", headers=AUTH)
    assert bad.status_code == 400 and "limit" in bad.json()["detail"]


def test_nocache_is_accepted_and_the_answer_is_the_same(client):
    plain = get(client, "/api/ticker-returns", ticker="SPY").json()  # now in the render cache
    fresh = get(client, "/api/ticker-returns", ticker="SPY", nocache="true")
    assert fresh.json() == plain and plain["asset_type"] == "etf"
    etag = {**AUTH, "If-None-Match": fresh.headers["ETag"]}
    assert client.get("/api/ticker-returns?ticker=SPY", headers=etag).status_code == 304
    again = client.get("/api/ticker-returns?ticker=SPY&nocache=true", headers=etag)
    assert again.status_code == 200 and again.json() == plain


def test_parquet_and_csv_carry_the_lineage(client, snap):
    resp = get(client, "/api/ticker-returns", ticker="NVDA", format="parquet")
    meta = pq.read_table(io.BytesIO(resp.content)).schema.metadata
    assert meta[b"model_version"].decode() == snap.version
    assert meta[b"data_as_of"].decode() == str(snap.manifest["data_as_of"])
    csv = get(client, "/api/ticker-returns", ticker="NVDA", format="csv")
    assert csv.text.startswith('"date","returns_gross",')  # a plain table, header first
    lineage = f"# model_version={snap.version}, data_as_of={snap.manifest['data_as_of']}\n"
    commented = get(client, "/api/ticker-returns", ticker="NVDA", format="csv", csv_comment="true")
    assert commented.text == lineage + csv.text
    assert commented.headers["ETag"] != csv.headers["ETag"]
    body = {"tickers": ["NVDA"], "metrics": ["returns"], "format": "csv", "csv_comment": True}
    table = batch(client, body).text
    assert table.startswith(lineage + '"ticker","date",')
    same = get(client, "/api/ticker-returns", ticker="NVDA", format="json", csv_comment="true")
    assert same.json() == get(client, "/api/ticker-returns", ticker="NVDA").json()


# --------------------------------------------------------------------------- §10 l3


def test_l3_decomposition_answers_the_column_layout_with_long_names(client, snap):
    doc = get(client, "/api/l3-decomposition", ticker="NVDA", years=2).json()
    rows = doc["data"]
    assert doc["dates"] == [r["date"] for r in rows] and len(rows) > 400
    for long, short in L3_LONG.items():
        assert doc[long] == [r[short] for r in rows], long
    as_of = date.fromisoformat(snap.manifest["data_as_of"])
    start = date.fromordinal(minus_years(as_of, 2).toordinal() + 1)
    same = get(client, "/api/l3-decomposition", ticker="NVDA", **{"from": str(start)}).json()
    assert same["dates"] == doc["dates"]
    assert same["l3_residual_er"] == doc["l3_residual_er"]
    assert doc["meta"]["from"] == str(start) and doc["meta"]["years"] == 2
    default = get(client, "/api/l3-decomposition", ticker="NVDA").json()
    assert len(default["dates"]) < len(doc["dates"])  # one year without `years`


def test_l3_market_factor_etf_is_the_snapshots_market_etf_only(client):
    spy = get(client, "/api/l3-decomposition", ticker="NVDA", market_factor_etf="spy").json()
    assert spy["dates"] == get(client, "/api/l3-decomposition", ticker="NVDA").json()["dates"]
    resp = client.get("/api/l3-decomposition?ticker=NVDA&market_factor_etf=QQQ", headers=AUTH)
    body = resp.json()
    assert resp.status_code == 400 and body["accepted"] == ["SPY"]
    assert "QQQ" in body["message"] and "SPY" in body["message"]
    both = client.get("/api/l3-decomposition?ticker=NVDA&years=2&from=2024-01-02", headers=AUTH)
    assert both.status_code == 400 and both.json()["parameters"] == ["years", "from"]


def test_l3_csv_and_parquet_stay_row_tables(client, snap):
    doc = get(client, "/api/l3-decomposition", ticker="NVDA").json()
    table = pq.read_table(
        io.BytesIO(get(client, "/api/l3-decomposition", ticker="NVDA", format="parquet").content)
    )
    risk_and_vol = [
        "risk_total_vol",
        "risk_factor_vol",
        "risk_specific_vol",
        "vol_23d",
        "vol_252d_ann",
    ]
    assert table.column_names == ["date", *L3_LONG.values(), *risk_and_vol]
    assert table.column("l3_mkt_hr").to_pylist() == doc["l3_market_hr"]
    for name in risk_and_vol:  # the JSON answer's rows carry them under the same names
        assert table.column(name).to_pylist() == [row[name] for row in doc["data"]], name
    assert table.schema.metadata[b"model_version"].decode() == snap.version


# --------------------------------------------------------------------------- §11 batch


def test_batch_entries_have_the_real_services_shape(client):
    body = {
        "tickers": ["NVDA", "AAPL", "NOPE"],
        "metrics": ["full_metrics", "hedge_ratios", "returns"],
        "years": 1,
        "format": "json",
    }
    doc = batch(client, body).json()
    assert list(doc["results"]) == ["NVDA", "AAPL", "NOPE"]
    for ticker in ("NVDA", "AAPL"):
        entry = doc["results"][ticker]
        metrics = get(client, f"/api/metrics/{ticker}").json()
        m = metrics["metrics"]
        assert entry["status"] == "success" and entry["ticker"] == ticker
        flat = entry["full_metrics"]
        assert flat["date"] == metrics["teo"] and flat["ticker"] == ticker
        assert {k: flat[k] for k in m} == m
        assert all(not isinstance(v, dict | list) for v in flat.values())
        assert entry["hedge_ratios"] == {
            "l1_market": m["l1_mkt_hr"],
            "l2_market": m["l2_mkt_hr"],
            "l2_sector": m["l2_sec_hr"],
            "l3_market": m["l3_mkt_hr"],
            "l3_sector": m["l3_sec_hr"],
            "l3_subsector": m["l3_sub_hr"],
        }
        assert entry["hedge_levels"] == metrics["hedge_levels"]
        meta = entry["meta"]
        assert meta["sector_etf"] == metrics["meta"]["sector_etf"]
        assert meta["subsector_etf"] == meta["subsector_etf_symbol"]
        assert meta["name"] == metrics["meta"]["company_name"]
        rows = get(client, "/api/ticker-returns", ticker=ticker).json()["data"]
        ret = entry["returns"]
        assert ret["dates"] == [r["date"] for r in rows]
        assert ret["values"] == [r["returns_gross"] for r in rows]
        assert ret["l1"] == ret["l3_market_hr"] == [r["l3_mkt_hr"] for r in rows]
        assert ret["l2"] == ret["l3_sector_hr"] == [r["l3_sec_hr"] for r in rows]
        assert ret["l3"] == ret["l3_subsector_hr"] == [r["l3_sub_hr"] for r in rows]
    nope = doc["results"]["NOPE"]
    assert nope["status"] == "error" and nope["code"] == "TICKER_NOT_FOUND"
    assert isinstance(nope["error"], str) and "NOPE" in nope["error"]


def test_a_long_batch_is_one_canonical_json_text_with_each_tickers_own_rows(client, snap):
    """A batch over many chunks of sessions, planned from each ticker's prices read alone and
    written entry by entry: the text is what one orjson.dumps of its values writes (decoded
    and written again, the same bytes), and each entry's rows are the ticker's own
    (/api/ticker-returns, read from the whole assembled row), ETFs and late listings too."""
    tickers = [*snap.symbols["ticker"].tolist()[:12], "NOPE"]
    metrics = ["returns", "hedge_ratios", "full_metrics", "l3_decomposition"]
    resp = batch(client, {"tickers": tickers, "metrics": metrics, "years": 2})  # the series cap
    assert orjson.dumps(orjson.loads(resp.content)) == resp.content
    doc = resp.json()
    assert list(doc["results"]) == tickers and doc["summary"]["failed"] == 1
    for ticker in tickers[:-1]:
        ret = doc["results"][ticker]["returns"]
        rows = get(client, "/api/ticker-returns", ticker=ticker, years=2).json()["data"]
        assert len(rows) > 2 * 128  # more than two chunks: a long read
        assert ret["dates"] == [r["date"] for r in rows]
        assert ret["values"] == [r["returns_gross"] for r in rows]
        assert ret["l1"] == ret["l3_market_hr"] == [r["l3_mkt_hr"] for r in rows]
        assert ret["l3"] == ret["l3_subsector_hr"] == [r["l3_sub_hr"] for r in rows]


def test_batch_l3_decomposition_metric_equals_the_route(client):
    doc = batch(client, {"tickers": ["NVDA"], "metrics": ["l3_decomposition"], "years": 2})
    entry = doc.json()["results"]["NVDA"]["l3_decomposition"]
    route = get(client, "/api/l3-decomposition", ticker="NVDA", years=2).json()
    assert entry == {k: route[k] for k in ("dates", *L3_LONG)}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "PARQUET"])
def test_batch_long_table_formats(client, snap, fmt):
    body = {"tickers": ["NVDA", "SPY", "NOPE"], "metrics": ["returns"], "years": 1, "format": fmt}
    resp = batch(client, body)
    if fmt.lower() == "parquet":
        table = pq.read_table(io.BytesIO(resp.content))
        assert table.schema.metadata[b"model_version"].decode() == snap.version
        assert table.schema.metadata[b"data_as_of"].decode() == str(snap.manifest["data_as_of"])
    else:
        assert resp.headers["content-type"].startswith("text/csv")
        table = pacsv.read_csv(io.BytesIO(resp.content))
    assert table.column_names == [
        "ticker",
        "date",
        "returns_gross",
        "l3_market_hr",
        "l3_sector_hr",
        "l3_subsector_hr",
    ]
    assert resp.headers["X-Failed-Tickers"] == "NOPE"
    tickers = table.column("ticker").to_pylist()
    expected_rows = 0
    for ticker in ("NVDA", "SPY"):
        rows = get(client, "/api/ticker-returns", ticker=ticker).json()["data"]
        pos = np.flatnonzero(np.array(tickers) == ticker)
        assert len(pos) == len(rows) and np.all(np.diff(pos) == 1)
        dates = [str(d)[:10] for d in table.column("date").to_pylist()]
        assert [dates[i] for i in pos] == [r["date"] for r in rows]
        got = table.column("l3_market_hr").to_pylist()
        assert [got[i] for i in pos] == pytest.approx([r["l3_mkt_hr"] for r in rows], nan_ok=True)
        expected_rows += len(rows)
    assert table.num_rows == expected_rows
    est = client.post(
        "/api/estimate", json={"endpoint": "batch/analyze", "params": body}, headers=AUTH
    ).json()
    assert est["estimated_rows"] == table.num_rows
    assert resp.headers["X-API-Cost-USD"] == f"{est['estimated_cost_usd']:.5f}"


def test_batch_refuses_an_unknown_format_and_unknown_fields(client):
    resp = client.post(
        "/api/batch/analyze", json={"tickers": ["NVDA"], "format": "xlsx"}, headers=AUTH
    )
    assert resp.status_code == 400 and "format" in resp.json()["message"]
    resp = client.post("/api/batch/analyze", json={"tickers": ["NVDA"], "fmt": "csv"}, headers=AUTH)
    body = resp.json()
    assert resp.status_code == 400 and "fmt" in body["detail"] and "format" in body["detail"]


# --------------------------------------------------------------------------- §2 demo key


def test_the_demo_key_accepts_the_class_twin_the_real_client_sends(client):
    metrics = client.get("/api/metrics/GOOG", headers=DEMO)
    assert metrics.status_code == 200, metrics.text
    googl = get(client, "/api/metrics/GOOGL").json()
    assert metrics.json()["metrics"] == googl["metrics"] and metrics.json()["ticker"] == "GOOGL"
    doc = batch(client, {"tickers": ["GOOG", "AAPL"], "metrics": ["hedge_ratios"]}, DEMO).json()
    assert doc["results"]["GOOG"]["status"] == "success"
    assert doc["results"]["GOOG"]["hedge_ratios"]["l1_market"] == googl["metrics"]["l1_mkt_hr"]
    other = client.get("/api/metrics/JPM", headers=DEMO)
    assert other.status_code == 403 and other.json()["error"] == "DEMO_RESTRICTED"
