"""Issue 39: a folder ingest named its data source after its first file (`AAL_data`); it is
named after the folder (docs/decisions/ingest.md), a file ingest after the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.data.ingested import read_ingested


def _one_symbol_file(path: Path, seed: int) -> None:
    days = sessions_between(pd.Timestamp("2018-01-02"), pd.Timestamp("2018-02-28"))
    close = 30 * np.exp(np.cumsum(np.random.default_rng(seed).normal(0, 0.01, len(days))))
    pd.DataFrame({"date": days.strftime("%Y-%m-%d"), "open": close, "close": close,
                  "volume": 1e6}).to_csv(path, index=False)  # fmt: skip


def test_a_folder_is_named_after_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "individual_stocks_5yr"
    folder.mkdir()
    _one_symbol_file(folder / "AAL_data.csv", 1)
    _one_symbol_file(folder / "AAPL_data.csv", 2)
    report = ingest([folder], None, home=tmp_path / "home")
    assert report.ok and report.data_source == "individual_stocks_5yr"
    prices, _, meta = read_ingested(tmp_path / "home")
    assert meta["data_source"] == "individual_stocks_5yr"
    assert sorted(prices["symbol"].unique()) == ["AAL", "AAPL"]
    # A file keeps its own name.
    single = ingest([folder / "AAPL_data.csv"], None, home=tmp_path / "other")
    assert single.data_source == "AAPL_data"
