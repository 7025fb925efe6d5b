"""Macro and style factors, correlations and ETF factor returns (issue 38) on a slice of the real
data set that holds the factor ETFs (HYG, GLD, IEF, MTUM, ...): values against pandas on the
same series, a factor the data lacks null with a warning, the IEF proxy labelled as one."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import to_panel
from eqrisk.model.run import ModelParams, run_model
from eqrisk.settings import Settings
from eqrisk.snapshot import tables
from eqrisk.snapshot.versions import write_snapshot
from helpers import TEST_KEY, assert_problem, gics_master, register_key, shared_file

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
MACRO_ETFS = ["HYG", "LQD", "USO", "GLD", "TLT", "IEF", "MTUM", "QUAL", "USMV", "VLUE", "IWF"]
SLICE = ["SPY", "XLK", "SMH", "XLF", "KRE", "NVDA", "AMD", "AAPL", "JPM", "KEY", *MACRO_ETFS]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    """The slice's columns of the real adjusted-close file, classified, built in process."""
    wide = pd.read_csv(shared_file("adjclose_wide_2010_2026.csv.gz"), usecols=["date", *SLICE])
    long = wide.melt(id_vars="date", var_name="symbol", value_name="close").dropna()
    master = gics_master(pd.read_csv(shared_file("gics_constituents.csv")))
    etfs = pd.DataFrame({"symbol": sorted(set(long["symbol"]) - set(master["symbol"]))})
    master = pd.concat([master, etfs], ignore_index=True)
    master = classify(master[master["symbol"].isin(set(long["symbol"]))], Mappings.load())
    panel = to_panel(long)
    result = run_model(panel, master, ModelParams(252, 126))
    home: Path = tmp_path_factory.mktemp("macro-home")
    content = tables.SnapshotContent(
        result=result, panel=panel, master=master, data_source="real", ingest={}
    )
    write_snapshot(home, content)
    register_key(home, TEST_KEY)
    return TestClient(create_app(Settings(home=home, _env_file=None)))


def get(client: TestClient, url: str, **params: Any) -> Any:
    resp = client.get(url, params=params, headers=AUTH)
    assert resp.status_code == 200, resp.text[:400]
    return resp.json()


def series(client: TestClient, ticker: str, column: str) -> pd.Series:
    rows = get(client, "/api/ticker-returns", ticker=ticker, start="2000-01-03")["data"]
    frame = pd.DataFrame(rows)
    return pd.Series(frame[column].to_numpy(dtype=float), index=frame["date"]).dropna()


def test_macro_factors_are_the_etfs_returns_and_missing_ones_say_so(client: TestClient) -> None:
    doc = get(client, "/api/macro-factors", factors="HY, gold,usd,ust,nope", start="2024-01-01")
    assert doc["factors_requested"] == ["credit", "gold", "usd", "term_spread"]
    frame = pd.DataFrame(doc["series"])
    assert doc["row_count"] == len(frame) > 0
    assert list(frame["teo"]) == sorted(frame["teo"])
    assert set(frame["factor_key"]) == {"credit", "gold", "term_spread"}  # usd: no rows
    for key, etf in [("credit", "HYG"), ("gold", "GLD"), ("term_spread", "IEF")]:
        got = frame[frame["factor_key"] == key].set_index("teo")["return_gross"]
        want = series(client, etf, "returns_gross")
        want = want[want.index >= "2024-01-01"]
        pd.testing.assert_series_equal(got, want, check_names=False, check_index_type=False)
    proxy = frame[frame["factor_key"] == "term_spread"]["metadata"].iloc[0]
    assert proxy == {"series": "IEF", "category": "macro", "proxy_for": "VGIT"}
    warnings = " | ".join(doc["warnings"])
    assert "nope" in warnings and "usd: no series" in warnings and "proxy for VGIT" in warnings
    csv = client.get(
        "/api/macro-factors?factors=credit&start=2024-01-01&format=csv", headers=AUTH
    ).text
    table = pd.read_csv(io.StringIO(csv))
    assert list(table.columns) == ["factor_key", "teo", "return_gross"]
    credit = frame[frame["factor_key"] == "credit"]
    assert list(table["teo"]) == list(credit["teo"])
    np.testing.assert_allclose(table["return_gross"], credit["return_gross"], rtol=1e-15)


def test_macro_factor_errors(client: TestClient) -> None:
    assert_problem(
        client.get("/api/macro-factors?factors=nope", headers=AUTH), 400, "INVALID_PARAMETER"
    )
    late = "/api/macro-factors?start=2025-01-01&end=2024-01-01"
    assert_problem(client.get(late, headers=AUTH), 400, "INVALID_PARAMETER")
    long = "/api/macro-factors?start=2000-01-01&end=2024-01-01"
    assert_problem(client.get(long, headers=AUTH), 400, "INVALID_PARAMETER")


@pytest.mark.parametrize("method", ["pearson", "spearman"])
@pytest.mark.parametrize(
    ("return_type", "column"), [("gross", "returns_gross"), ("l3_residual", "l3_rr")]
)
def test_correlations_equal_pandas_on_the_same_series(
    client: TestClient, method: str, return_type: str, column: str
) -> None:
    params = {
        "factors": "credit,gold,momentum,usd,term_spread",
        "return_type": return_type,
        "method": method,
    }
    doc = get(client, "/api/metrics/nvda/correlation", window_days=252, **params)
    stock = series(client, "NVDA", column)
    for key, etf in [
        ("credit", "HYG"),
        ("gold", "GLD"),
        ("momentum", "MTUM"),
        ("term_spread", "IEF"),
    ]:
        pair = pd.concat([stock, series(client, etf, "returns_gross")], axis=1, join="inner")
        pair = pair.dropna().tail(252)
        want = pair.iloc[:, 0].corr(pair.iloc[:, 1], method=method)
        assert doc["correlations"][key] == pytest.approx(want, abs=1e-12)
    assert doc["correlations"]["usd"] is None
    assert any(w.startswith("usd: no series") for w in doc["warnings"])
    assert doc["sources"] == {
        "credit": {"etf": "HYG", "proxy_for": None},
        "gold": {"etf": "GLD", "proxy_for": None},
        "momentum": {"etf": "MTUM", "proxy_for": None},
        "usd": {"etf": None, "proxy_for": None},
        "term_spread": {"etf": "IEF", "proxy_for": "VGIT"},
    }
    assert doc["overlap_days"] == 252 and doc["macro_factors_loaded"] == 4
    assert doc["stock_series_length"] == len(stock)
    post = client.post(
        "/api/correlation",
        json={
            "ticker": "NVDA",
            "factors": ["hy", "xau", "mom", "dxy", "vgit"],
            "return_type": return_type,
            "method": method,
        },
        headers=AUTH,
    ).json()
    assert post["correlations"] == doc["correlations"]


def test_a_batch_of_correlations_keeps_the_order_and_fails_alone(client: TestClient) -> None:
    body = {"ticker": ["AAPL", "NOPE", "NVDA"], "factors": ["credit"], "window_days": 60}
    doc = client.post("/api/correlation", json=body, headers=AUTH).json()
    results = doc["results"]
    assert [r["ticker"] for r in results] == ["AAPL", "NOPE", "NVDA"]
    assert results[1]["status"] == 404 and "NOPE" in results[1]["error"]
    single = get(client, "/api/metrics/AAPL/correlation", factors="credit", window_days=60)
    assert results[0]["correlations"] == single["correlations"]


def test_correlation_errors(client: TestClient) -> None:
    url = "/api/metrics/NVDA/correlation"
    assert_problem(client.get(f"{url}?factors=nope", headers=AUTH), 400, "INVALID_PARAMETER")
    assert_problem(client.get(f"{url}?window_days=19", headers=AUTH), 400, "INVALID_PARAMETER")
    assert_problem(client.get(f"{url}?method=kendall", headers=AUTH), 400, "INVALID_PARAMETER")
    etf = client.get("/api/metrics/SPY/correlation?return_type=l2", headers=AUTH)
    assert_problem(etf, 400, "INVALID_PARAMETER")
    assert_problem(
        client.get("/api/metrics/NOPE/correlation", headers=AUTH), 404, "TICKER_NOT_FOUND"
    )


def test_etf_factor_returns_compound_the_daily_returns(client: TestClient) -> None:
    doc = get(client, "/api/etf/factor-returns")
    assert doc["windows"] == ["1d", "21d", "63d", "252d"]
    rows = {r["ticker"]: r for r in doc["rows"]}
    assert set(rows) == {"SPY", "XLK", "XLF"}  # the scope's ETFs the slice holds
    assert rows["SPY"]["sleeve"] == "market" and rows["XLK"]["sleeve"] == "sector"
    xlk = series(client, "XLK", "returns_gross")
    for window, n in [("1d", 1), ("21d", 21), ("252d", 252)]:
        want = (1 + xlk.tail(n)).prod() - 1
        assert rows["XLK"]["returns"][window] == pytest.approx(want, rel=1e-12)
    bad = client.get("/api/etf/factor-returns?tickers=KRE", headers=AUTH)
    assert_problem(bad, 400, "INVALID_PARAMETER")


def test_an_end_before_year_one_plus_the_default_span_is_an_empty_answer(
    client: TestClient,
) -> None:
    """`end=0001-01-01` (schemathesis found it: the default start, 5 years earlier, was a year
    before 1 and a 500): no session is that early, so every series is empty, not an error."""
    for end, start in (("0001-01-01", "0001-01-01"), ("0003-02-28", "0001-01-01"),
                       ("0006-03-01", "0001-03-01")):  # fmt: skip
        body = get(client, "/api/macro-factors", end=end)
        assert (body["start"], body["end"]) == (start, end)
        assert body["row_count"] == 0 and body["series"] == []
