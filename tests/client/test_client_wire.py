"""eqrisk.client on the real Service B's shapes (issue 13 part 1): batch formats, l3 years and
market ETF, ticker-returns limit, search metadata, CSV lineage, `message`, and the model version
header; against a real `eqrisk serve` and the app in process (the fixtures of test_client)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from client.conftest import FUNDED, MakeClient
from eqrisk.client import InvalidParameter, NotFound
from eqrisk.client.frames import table_of


def test_batch_formats_give_one_long_table(make: MakeClient) -> None:
    c = make()
    answer = c.batch_analyze(["NVDA", "AAPL", "NOPE_X"], ["returns", "hedge_ratios"])
    entry = answer["results"]["NVDA"]
    assert entry["status"] == "success" and isinstance(answer["results"]["NOPE_X"]["error"], str)
    assert set(entry["hedge_levels"]) >= {"L1", "L2", "L3"}
    for fmt in ("parquet", "csv"):
        table = c.batch_analyze(["NVDA", "AAPL", "NOPE_X"], ["returns"], format=fmt)
        assert {"ticker", "date", "returns_gross", "l3_market_hr"} <= set(table.columns)
        assert table.attrs["failed_tickers"] == ["NOPE_X"]
        nvda = table[table["ticker"] == "NVDA"]
        returns = entry["returns"]
        assert len(nvda) == len(returns["dates"])
        assert list(nvda["date"]) == list(pd.to_datetime(returns["dates"]))
        assert np.allclose(
            nvda["returns_gross"], np.array(returns["values"], dtype=float), equal_nan=True
        )


def test_l3_years_market_etf_and_json_columns(make: MakeClient) -> None:
    c = make()
    parquet = c.l3_decomposition("NVDA", years=1)
    as_json = c.l3_decomposition("NVDA", years=1, format="json")
    pd.testing.assert_frame_equal(as_json, parquet, check_dtype=False)
    # The column layout of the JSON answer (`dates` + long-name arrays), read on its own.
    headers = {"Authorization": f"Bearer {FUNDED}"}
    raw = c._http.get("/api/l3-decomposition?ticker=NVDA&years=1", headers=headers).json()
    raw.pop("data", None)
    columns = table_of(raw)
    assert list(pd.to_datetime(columns["date"])) == list(parquet["date"]) and len(parquet) > 200
    for long, short in (("l3_market_hr", "l3_mkt_hr"), ("l3_residual_er", "l3_res_er")):
        assert np.allclose(columns[long].astype(float), parquet[short], equal_nan=True)
    assert len(c.l3_decomposition("NVDA", years=1, market_factor_etf="SPY")) == len(parquet)
    with pytest.raises(InvalidParameter) as other:
        c.l3_decomposition("NVDA", market_factor_etf="QQQ")
    assert "SPY" in str(other.value)


def test_ticker_returns_limit_csv_lineage_and_the_version_header(make: MakeClient) -> None:
    c = make()
    full = c.ticker_returns("NVDA", years=1)
    last5 = c.ticker_returns("NVDA", years=1, limit=5, nocache=True)
    assert list(last5["date"]) == list(full["date"].iloc[-5:])
    version = c.health()["model_version"]
    response = c._http.get("/api/metrics/NVDA", headers={"Authorization": f"Bearer {FUNDED}"})
    assert response.headers["x-risk-model-version"] == version
    commented = c.ticker_returns("NVDA", format="csv", csv_comment=True)
    assert commented.attrs["model_version"] == version and len(commented) == len(full)
    hits = c.tickers("NVDA", include_metadata=True)
    assert "NVDA" in set(hits["ticker"])
    with pytest.raises(NotFound) as missing:
        c.metrics("NVDAX")
    assert missing.value.detail == missing.value.body["message"]
