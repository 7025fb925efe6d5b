"""Issue 12, foreign layouts: column aliases, an explicit mapping, a directory of per-symbol
files, checked against the files' own columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data.columns import parse_mapping, symbol_from_file_name
from eqrisk.data.ingest import ingest
from eqrisk.data.ingested import read_ingested
from eqrisk.data.master_files import read_master
from helpers import shared_file

SYMBOLS = ["AAPL", "MSFT", "JPM"]


@pytest.fixture(scope="module")
def ohlcv() -> pd.DataFrame:
    frame = pd.read_csv(shared_file("ohlcv_long_2010_2020.csv.gz"))
    frame = frame[frame["symbol"].isin(SYMBOLS) & (frame["date"] >= "2013-02-08")]
    return frame[frame["date"] <= "2018-02-07"].sort_values(["symbol", "date"], ignore_index=True)


def _stored(home: Path) -> pd.DataFrame:
    prices, _, _ = read_ingested(home)
    return prices.sort_values(["symbol", "date"], ignore_index=True)


def test_directory_of_per_symbol_files_with_a_name_column(ohlcv, tmp_path) -> None:
    folder = tmp_path / "individual_stocks_5yr"
    folder.mkdir()
    for symbol, rows in ohlcv.groupby("symbol"):
        # The S&P 5-year layout: date, open, high, low, close, volume, Name.
        out = rows[["date", "open", "high", "low", "close", "volume", "symbol"]]
        out.rename(columns={"symbol": "Name"}).to_csv(folder / f"{symbol}_data.csv", index=False)
    home = tmp_path / "home"
    report = ingest([folder], None, home=home)
    assert report.ok and report.symbols == 3
    assert len(report.files) == 3
    stored = _stored(home)
    # Traded closes with no factor columns: the cleaning stage leaves out AAPL's 7:1 split of
    # 2014-06-09 and re-bases the closes before it (docs/decisions/return-cleaning.md); every
    # other close is the file's.
    ratio = stored["close"].to_numpy() / ohlcv["close"].to_numpy()
    before = (stored["symbol"] == "AAPL").to_numpy() & (
        stored["date"] < pd.Timestamp("2014-06-09").date()
    ).to_numpy()
    np.testing.assert_allclose(ratio[before], 1 / 7, rtol=1e-12)
    np.testing.assert_array_equal(ratio[~before], 1.0)
    np.testing.assert_array_equal(stored["volume"].to_numpy(), ohlcv["volume"].to_numpy())
    assert sorted(stored["symbol"].unique()) == sorted(SYMBOLS)


def test_per_symbol_files_without_a_symbol_column_take_the_file_name(ohlcv, tmp_path) -> None:
    folder = tmp_path / "yahoo"
    folder.mkdir()
    for symbol, rows in ohlcv.groupby("symbol"):
        out = rows.rename(
            columns={"date": "Date", "close": "Close", "adjusted_close": "Adj Close"}
        )[["Date", "open", "Close", "Adj Close", "volume"]]
        out.to_csv(folder / f"{symbol.lower()}.csv", index=False)
    home = tmp_path / "home"
    assert ingest([folder], None, home=home).ok
    stored = _stored(home)
    assert sorted(stored["symbol"].unique()) == sorted(SYMBOLS)
    # `Adj Close` is the model's close, `Close` the traded one.
    np.testing.assert_array_equal(stored["close"].to_numpy(), ohlcv["adjusted_close"].to_numpy())
    np.testing.assert_array_equal(stored["close_raw"].to_numpy(), ohlcv["close"].to_numpy())


def test_explicit_column_mapping_wins_over_aliases(ohlcv, tmp_path) -> None:
    path = tmp_path / "vendor.csv"
    out = ohlcv.rename(columns={"symbol": "Code", "date": "As Of", "adjusted_close": "Last"})
    # `Name` would be taken for the symbol by its alias: the mapping says otherwise.
    out.assign(Name="some company")[["As Of", "Code", "Name", "Last"]].to_csv(path, index=False)
    home = tmp_path / "home"
    mapping = parse_mapping(["symbol=Code", "date=As Of", "close=Last"])
    assert ingest([path], None, home=home, columns=mapping).ok
    stored = _stored(home)
    assert sorted(stored["symbol"].unique()) == sorted(SYMBOLS)
    np.testing.assert_array_equal(stored["close"].to_numpy(), ohlcv["adjusted_close"].to_numpy())


def test_bad_mapping_says_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"CANONICAL=SOURCE.*symbol"):
        parse_mapping(["ticker"])
    with pytest.raises(ValueError, match="adjusted_close"):
        parse_mapping(["price=Close"])


def test_master_with_ticker_symbol_column(tmp_path) -> None:
    gics = pd.read_csv(shared_file("gics_constituents.csv"))
    path = tmp_path / "securities.csv"
    gics.rename(columns={"Symbol": "Ticker Symbol"}).to_csv(path, index=False)
    master = read_master(path).set_index("symbol")
    assert len(master) == len(gics)
    assert master.loc["AAPL", "gics_sector"] == "Information Technology"
    assert master.loc["AAPL", "name"] == gics.set_index("Symbol").loc["AAPL", "Security"]


def test_symbol_from_file_name() -> None:
    assert symbol_from_file_name(Path("AAPL_data.csv")) == "AAPL"
    assert symbol_from_file_name(Path("brk.b.csv.gz")) == "BRK.B"
    assert symbol_from_file_name(Path("MSFT.parquet")) == "MSFT"
