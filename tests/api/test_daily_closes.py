"""`/daily` on raw input (issue 22 item 8): the adjusted close under `close` and the close as
traded under `close_raw`, against the vendor file's own columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from eqrisk.api.app import create_app
from eqrisk.settings import Settings
from helpers import SHARED_DATA, register_key

KEY = "daily-closes-test-key-not-secret"
SYMBOLS = ["AAPL", "MSFT", "SPY", "XLK"]


@pytest.mark.slow
def test_raw_closes_with_factors_serve_both_closes_under_their_names(tmp_path: Path) -> None:
    """Raw closes with the vendor's split and dividend columns, `--prices raw`, the adjusted
    column removed: `close_raw` is the file's close, `close` moves as the vendor's adjusted
    close (AAPL's 4:1 split of 2020-08-31 is no return), and neither is null."""
    from eqrisk.build.pipeline import build_snapshot
    from eqrisk.data.ingest import ingest
    from eqrisk.model.run import ModelParams

    full = pd.read_csv(SHARED_DATA / "ohlcv_long_2010_2020.csv.gz")
    full = full[full["symbol"].isin(SYMBOLS) & (full["date"] >= "2018-01-01")]
    home = tmp_path / "home"
    home.mkdir()
    full.drop(columns=["adjusted_close"]).to_csv(home / "raw.csv", index=False)
    assert ingest([home / "raw.csv"], None, home=home, prices_basis="raw").ok
    build_snapshot(home, ModelParams())
    register_key(home, KEY)
    client = TestClient(create_app(Settings(home=home, _env_file=None), services=("daily",)))
    for symbol in ("AAPL", "SPY"):
        resp = client.get(
            "/daily",
            params={"symbols": symbol, "start_time": "2018-01-01", "fields": "close,close_raw"},
            headers={"apikey": KEY},
        )
        assert resp.status_code == 200, resp.text
        got = pd.DataFrame(resp.json()).set_index("teo")
        own = full[full["symbol"] == symbol].set_index("date")
        assert list(got.index) == list(own.index)
        assert got["close"].notna().all() and got["close_raw"].notna().all()
        np.testing.assert_array_equal(got["close_raw"].to_numpy(), own["close"].to_numpy())
        mine = got["close"].pct_change().to_numpy()[1:]
        vendor = own["adjusted_close"].pct_change().to_numpy()[1:]
        np.testing.assert_allclose(mine, vendor, rtol=0, atol=1e-6)
    aapl = client.get(
        "/daily",
        params={"symbols": "AAPL", "start_time": "2020-08-28", "end_time": "2020-08-31"},
        headers={"apikey": KEY},
    ).json()
    assert aapl[1]["close_raw"] < aapl[0]["close_raw"] / 3  # as traded: the split shows
    assert 0.9 < aapl[1]["close"] / aapl[0]["close"] < 1.1  # adjusted: it does not
