"""Ingestion of price files and a security master: formats, validation, report, store."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from data.measured import doc_table
from eqrisk.data import ingested as store
from eqrisk.data import panel
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestError, IngestReport, render_report
from eqrisk.data.master import etf_registry
from eqrisk.data.master_files import read_master
from eqrisk.data.price_files import read_prices
from helpers import SHARED_DATA

DATA = SHARED_DATA
WIDE = DATA / "adjclose_wide_2010_2026.csv.gz"
LONG = DATA / "ohlcv_long_2010_2020.csv.gz"
GICS = DATA / "gics_constituents.csv"
SMALL_MASTER = DATA / "small_universe.csv"
SMALL_PRICES = DATA / "small_adjclose_2019_2026.csv.gz"

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real data folder {DATA} is absent")


def _issue(report: IngestReport, code: str) -> dict | None:
    found = [i for i in report.issues if i["code"] == code]
    assert len(found) <= 1
    return found[0] if found else None


def _count(report: IngestReport, code: str) -> int:
    issue = _issue(report, code)
    return 0 if issue is None else issue["count"]


def _codes(report: IngestReport) -> dict[str, int]:
    return {i["code"]: i["count"] for i in report.issues}


def _write(path: Path, text: str) -> Path:
    path.write_text(text.lstrip())
    return path


def _stored(home: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    prices, master, meta = store.read_ingested(home)
    prices["date"] = pd.to_datetime(prices["date"])
    return prices, master, meta


def _price(prices: pd.DataFrame, symbol: str, day: str, field: str = "close") -> float:
    row = prices[(prices["symbol"] == symbol) & (prices["date"] == pd.Timestamp(day))]
    assert len(row) == 1, (symbol, day, len(row))
    return float(row[field].iloc[0])


# --------------------------------------------------------------------------------------------
# Real files


@pytest.fixture(scope="module")
def wide_ingest(tmp_path_factory: pytest.TempPathFactory) -> tuple[IngestReport, Path]:
    if not DATA.is_dir():
        pytest.skip(f"real data folder {DATA} is absent")
    home = tmp_path_factory.mktemp("home")
    stages: list[str] = []
    report = ingest([WIDE], GICS, home=home, progress=stages.append)
    assert stages[0] == f"reading {WIDE.name}"
    assert "validating" in stages
    assert stages[-1] == "writing"
    return report, home


@needs_data
def test_real_wide_file_with_gics_master(wide_ingest: tuple[IngestReport, Path]) -> None:
    report, home = wide_ingest
    assert report.ok
    assert report.symbols == 574
    assert report.sessions == 4169
    assert (report.first_date, report.last_date) == ("2010-01-04", "2026-07-31")
    assert report.rows_rejected == 0
    assert report.rows_read == report.rows_kept
    assert report.data_source == "adjclose_wide_2010_2026"
    # the five S&P names the price file lacks
    missing = _issue(report, "MISSING_PRICES")
    assert missing is not None and missing["count"] == 5
    assert missing["examples"] == ["ED", "LULU", "ROP", "UNH", "XYL"]
    # every ETF of the file is in the registry, every stock in the S&P master
    assert _issue(report, "MISSING_FROM_MASTER") is None

    expected = pd.read_csv(WIDE, usecols=["date", "AAPL", "BRK.B", "SPY"], dtype={"date": str})
    expected = expected.set_index("date")
    prices, master, meta = _stored(home)
    assert len(prices) == report.rows_kept
    for day in ("2010-01-04", "2015-06-30", "2020-03-16", "2026-07-31"):
        assert _price(prices, "AAPL", day) == expected.loc[day, "AAPL"]
        assert _price(prices, "SPY", day) == expected.loc[day, "SPY"]
    assert _price(prices, "BRK.B", "2020-03-16") == expected.loc["2020-03-16", "BRK.B"]
    # a wide file has no raw close or volume
    assert prices["close_raw"].isna().all() and prices["volume"].isna().all()
    # empty cells are no rows: a symbol listed later starts later
    abnb = prices[prices["symbol"] == "ABNB"]
    assert len(abnb) == expected.shape[0] - pd.read_csv(WIDE, usecols=["ABNB"])["ABNB"].isna().sum()

    gics = pd.read_csv(GICS)
    assert len(master) == len(gics)
    aapl = master.set_index("symbol").loc["AAPL"]
    assert aapl["gics_sector"] == "Information Technology"
    assert aapl["asset_type"] == "stock"
    assert aapl["name"] == "Apple Inc."
    assert meta["data_source"] == "adjclose_wide_2010_2026"
    assert meta["counts"]["rows_kept"] == report.rows_kept

    folder = Path(report.report_dir)
    assert folder.parent == home / "reports" and folder.name.startswith("ingest-")
    assert json.loads((folder / "report.json").read_text()) == json.loads(
        json.dumps(report.to_dict())
    )
    assert pd.read_csv(folder / "rejected.csv").empty
    flagged = pd.read_csv(folder / "flagged.csv")
    assert len(flagged) == report.rows_flagged == _count(report, "LARGE_MOVE")
    assert (flagged["return"].abs() > 0.5).all()


@needs_data
def test_render_report(wide_ingest: tuple[IngestReport, Path]) -> None:
    report, _ = wide_ingest
    console = Console(record=True, width=200)
    render_report(report, console)
    text = console.export_text()
    assert "OK" in text
    assert "MISSING_PRICES" in text and "LULU" in text
    assert "LARGE_MOVE" in text
    assert str(Path(report.report_dir) / "rejected.csv") in text
    assert "574 symbols" in text and "4,169 sessions" in text


# Issue 33: real falls of the adjusted-close file an earlier rule took for spin-offs and a
# 3:2 split (the raw OHLCV file shows no split or dividend on those days, and 6-60x volume).
WIDE_CRASHES = [("PCG", "2019-01-14"), ("GL", "2024-04-11"), ("FISV", "2025-10-29"),
                ("SMCI", "2018-10-04"), ("DXCM", "2024-07-26"), ("CNC", "2025-07-02"),
                ("FLEX", "2018-10-26")]  # fmt: skip


@needs_data
@pytest.mark.slow
def test_real_wide_file_keeps_its_crashes(wide_ingest: tuple[IngestReport, Path]) -> None:
    """The closes-only file: every return the stage leaves out is named on the decision page
    (none today), and the seven crashes are returns of the model, listed with why."""
    report, home = wide_ingest
    table = pd.read_csv(Path(report.report_dir) / "return_decisions.csv", dtype={"date": str})
    dropped = table[table["action"] == "drop"]
    keys = zip(dropped["symbol"], dropped["date"], strict=True)
    assert dict(zip(keys, dropped["kind"], strict=True)) == doc_table("wide-closes-only")
    meta = json.loads((store.ingested_dir(home) / "meta.json").read_text())
    assert meta["return_breaks"] == [] and meta["price_kind"] == "raw"
    listed = table.set_index(["symbol", "date"])
    wide = pd.read_csv(WIDE, usecols=["date", *{s for s, _ in WIDE_CRASHES}]).set_index("date")
    for symbol, day in WIDE_CRASHES:
        row = listed.loc[(symbol, day)]
        assert (row["kind"], row["action"]) == ("move", "keep")
        assert "closes only" in row["reason"]
        falls = wide[symbol].pct_change()[day]
        assert row["return"] == pytest.approx(falls, rel=1e-9)
        assert falls < -0.3


@needs_data
@pytest.mark.slow
def test_real_long_ohlcv_file(tmp_path: Path) -> None:
    report = ingest([LONG], GICS, home=tmp_path)
    assert report.ok
    assert report.rows_read == report.rows_kept == 1_531_990
    assert report.symbols == 556
    assert (report.first_date, report.last_date) == ("2010-01-04", "2020-12-11")

    raw = pd.read_csv(LONG, engine="pyarrow")
    registry = set(etf_registry()["symbol"])
    in_gics = set(pd.read_csv(GICS)["Symbol"])
    delisted = sorted(set(raw["symbol"].unique()) - in_gics - registry)
    issue = _issue(report, "MISSING_FROM_MASTER")
    assert issue is not None and issue["severity"] == "warning"
    assert issue["count"] == len(delisted) > 0
    assert issue["examples"] == delisted[:5]

    prices, master, _ = _stored(tmp_path)
    assert len(prices) == len(raw)
    # delisted names are kept (as unclassified stocks), without a master row
    assert set(delisted) <= set(prices["symbol"].unique())
    assert not set(delisted) & set(master["symbol"].unique())

    sample = raw.sample(25, random_state=7)
    merged = sample.assign(date=pd.to_datetime(sample["date"])).merge(
        prices, on=["symbol", "date"], suffixes=("_file", "")
    )
    assert len(merged) == 25
    np.testing.assert_array_equal(merged["close"], merged["adjusted_close"])
    np.testing.assert_array_equal(merged["close_raw"], merged["close_file"])
    for col in ("open", "high", "low", "volume"):
        np.testing.assert_array_equal(merged[col], merged[f"{col}_file"].astype(float))
    assert _price(prices, "SPY", "2010-01-04", "close_raw") == 113.33
    assert _price(prices, "SPY", "2010-01-04", "volume") == 118857369


@needs_data
def test_small_universe_master_shares_from_market_cap(tmp_path: Path) -> None:
    report = ingest([SMALL_PRICES], SMALL_MASTER, home=tmp_path)
    assert report.ok
    assert report.symbols == 99
    assert _issue(report, "MISSING_FROM_MASTER") is None
    assert _issue(report, "MISSING_PRICES") is None
    prices, master, _ = _stored(tmp_path)
    universe = pd.read_csv(SMALL_MASTER)
    assert len(master) == len(universe) == 99
    master = master.set_index("symbol")
    last = prices.sort_values("date").groupby("symbol")["close"].last()
    stocks = universe[universe["kind"] == "stock"].set_index("symbol")
    assert len(stocks) == 66
    expected = stocks["market_cap_2026_08_22"] / last.reindex(stocks.index)
    np.testing.assert_allclose(master.loc[stocks.index, "shares"], expected, rtol=1e-12)
    assert (master.loc[stocks.index, "asset_type"] == "stock").all()
    etfs = universe.loc[universe["kind"] == "etf", "symbol"]
    assert (master.loc[etfs, "asset_type"] == "etf").all()
    assert master.loc[etfs, "shares"].isna().all()
    assert master.loc["NVDA", "gics_sector"] == "Information Technology"


@needs_data
def test_read_master_formats() -> None:
    gics = read_master(GICS)
    assert list(gics.columns[:6]) == panel.RAW_MASTER_COLUMNS
    assert gics.set_index("symbol").loc["BRK.B", "gics_sub_industry"] == ("Multi-Sector Holdings")
    assert set(gics["asset_type"]) == {"stock"}
    assert gics["shares"].isna().all()
    small = read_master(SMALL_MASTER)
    assert small["market_cap"].notna().sum() == 66
    assert small.set_index("symbol").loc["XLK", "asset_type"] == "etf"


# --------------------------------------------------------------------------------------------
# Validation on crafted files

BAD_LONG = """
date,symbol,close,volume
2020-12-18,AAA,99,1000
2020-12-21,AAA,100,1000
2020-12-22,AAA,101,1100
2020-12-22,AAA,101.5,1200
2020-12-23,AAA,abc,1000
2020-12-24,AAA,-5,1000
2020-12-25,AAA,102,1000
2020-12-26,AAA,102,1000
2020-12-28,AAA,161.6,900
2020-12-29,AAA,160,800
2020-13-01,AAA,160,800
2020-12-21,ZZZ,10,10
2020-12-22,ZZZ,11,20
"""
SMALL_MASTER_CSV = """
symbol,name,asset_type,gics_sector,gics_sub_industry,shares
AAA,Aaa Corp,stock,Information Technology,Application Software,1000
CCC,Ccc Corp,stock,Financials,Regional Banks,500
"""


def test_crafted_bad_file(tmp_path: Path) -> None:
    prices_path = _write(tmp_path / "bad.csv", BAD_LONG)
    master_path = _write(tmp_path / "master.csv", SMALL_MASTER_CSV)
    home = tmp_path / "home"
    report = ingest([prices_path], master_path, home=home, skip_bad_rows=True)
    assert not report.ok
    assert _codes(report) == {
        "DUPLICATE_ROW": 1,
        "NON_NUMERIC_PRICE": 1,
        "NON_POSITIVE_PRICE": 1,
        "NOT_A_SESSION": 2,
        "BAD_DATE": 1,
        "MISSING_FROM_MASTER": 1,
        "MISSING_PRICES": 1,
        "LARGE_MOVE": 1,
        "PARTIAL_CAPS": 1,  # ZZZ has no cap while AAA has one (issue 12)
        "LEVEL_MISSING": 1,  # AAA: no XLK in the prices and alone in its sector
    }
    assert _issue(report, "PARTIAL_CAPS")["examples"] == ["ZZZ"]
    for code in ("DUPLICATE_ROW", "NON_NUMERIC_PRICE", "BAD_DATE", "NOT_A_SESSION"):
        assert _issue(report, code)["severity"] == "error"
    for code in ("MISSING_FROM_MASTER", "MISSING_PRICES", "LARGE_MOVE"):
        assert _issue(report, code)["severity"] == "warning"
    assert _issue(report, "MISSING_FROM_MASTER")["examples"] == ["ZZZ"]
    assert _issue(report, "MISSING_PRICES")["examples"] == ["CCC"]
    non_numeric = _issue(report, "NON_NUMERIC_PRICE")["examples"][0]
    assert non_numeric["row"] == 6 and non_numeric["symbol"] == "AAA"
    assert "abc" in non_numeric["value"]
    assert report.rows_read == 13
    assert report.rows_rejected == 6
    assert report.rows_kept == 7
    assert report.rows_flagged == 1
    assert report.data_source == "bad"

    rejected = pd.read_csv(Path(report.report_dir) / "rejected.csv", dtype=str)
    got = set(
        zip(rejected["row"], rejected["date"], rejected["close"], rejected["reason"], strict=True)
    )
    assert got == {
        ("5", "2020-12-22", "101.5", "DUPLICATE_ROW"),
        ("6", "2020-12-23", "abc", "NON_NUMERIC_PRICE"),
        ("7", "2020-12-24", "-5", "NON_POSITIVE_PRICE"),
        ("8", "2020-12-25", "102", "NOT_A_SESSION"),
        ("9", "2020-12-26", "102", "NOT_A_SESSION"),
        ("12", "2020-13-01", "160", "BAD_DATE"),
    }
    assert rejected["volume"].tolist() == ["1200", "1000", "1000", "1000", "1000", "800"]
    detail = dict(zip(rejected["reason"], rejected["detail"].fillna(""), strict=False))
    assert detail["DUPLICATE_ROW"] == "duplicate of bad.csv:4 (kept)"
    assert detail["NON_NUMERIC_PRICE"] == "close='abc'"
    assert set(rejected["symbol"]) == {"AAA"}
    assert set(rejected["file"]) == {"bad.csv"}

    prices, master, _ = _stored(home)
    kept = set(zip(prices["symbol"], prices["date"].dt.strftime("%Y-%m-%d"), strict=True))
    assert kept == {
        ("AAA", "2020-12-18"),
        ("AAA", "2020-12-21"),
        ("AAA", "2020-12-22"),
        ("AAA", "2020-12-28"),
        ("AAA", "2020-12-29"),
        ("ZZZ", "2020-12-21"),
        ("ZZZ", "2020-12-22"),
    }
    assert _price(prices, "AAA", "2020-12-22") == 101.0  # the first of the duplicates
    assert _price(prices, "AAA", "2020-12-28") == 161.6  # the jump is kept
    assert _price(prices, "AAA", "2020-12-28", "volume") == 900
    assert set(master["symbol"]) == {"AAA", "CCC"}
    assert master.set_index("symbol").loc["AAA", "shares"] == 1000

    flagged = pd.read_csv(Path(report.report_dir) / "flagged.csv")
    assert flagged.to_dict("records") == [
        {
            "symbol": "AAA",
            "date": "2020-12-28",
            "prev_close": 101.0,
            "close": 161.6,
            "return": pytest.approx(0.6),
        }
    ]
    # a higher threshold flags nothing
    again = ingest(
        [prices_path], master_path, home=tmp_path / "home2", max_move=0.7, skip_bad_rows=True
    )
    assert _issue(again, "LARGE_MOVE") is None and again.rows_flagged == 0


def test_wide_file_with_text_cell(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "wide.csv",
        """
date,AAA,brk.b , CCC
2021-01-04,10,200,
2021-01-05,n/a,201,
2021-01-06,oops,202,5
2021-01-07,11,,5.5
""",
    )
    frame = read_prices(path)
    assert list(frame.columns[:9]) == panel.PRICE_COLUMNS
    assert len(frame) == 8  # empty and NA cells are no rows
    report = ingest([path], None, home=tmp_path / "home", skip_bad_rows=True)
    assert not report.ok
    assert _codes(report) == {"NON_NUMERIC_PRICE": 1}
    assert report.rows_read == 8 and report.rows_kept == 7 and report.rows_rejected == 1
    rejected = pd.read_csv(Path(report.report_dir) / "rejected.csv", dtype=str)
    assert rejected[["row", "date", "symbol", "close", "reason"]].values.tolist() == [
        ["4", "2021-01-06", "AAA", "oops", "NON_NUMERIC_PRICE"]
    ]
    prices, master, _ = _stored(tmp_path / "home")
    assert set(prices["symbol"]) == {"AAA", "BRK.B", "CCC"}
    assert _price(prices, "BRK.B", "2021-01-06") == 202
    assert _price(prices, "CCC", "2021-01-07") == 5.5
    assert master.empty and list(master.columns) == panel.RAW_MASTER_COLUMNS
    assert _issue(report, "MISSING_FROM_MASTER") is None  # no master given: no such warning


def test_long_file_aliases_raw_close_and_shares(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "prices.csv",
        """
Date,Ticker,Open,High,Low,Close,Adj Close,Volume,Shares,dividend_amount
2021-01-04, aapl ,10,12,9,11,5.5,100,1000,0
2021-01-05,AAPL,11,13,10,12,6,200,1000,0.5
""",
    )
    frame = read_prices(path)
    assert frame["symbol"].tolist() == ["AAPL", "AAPL"]
    assert frame["close"].tolist() == [5.5, 6.0]
    assert frame["close_raw"].tolist() == [11.0, 12.0]
    assert frame["open"].tolist() == [10.0, 11.0]
    assert frame["market_cap"].tolist() == [11000.0, 12000.0]  # shares x raw close
    only_close = _write(tmp_path / "only.csv", "date,symbol,close,market_cap\n2021-01-04,X,3,30\n")
    frame = read_prices(only_close)
    assert frame["close"].tolist() == [3.0]
    assert frame["close_raw"].isna().all()
    assert frame["market_cap"].tolist() == [30.0]


def test_parquet_equals_csv(tmp_path: Path) -> None:
    csv_path = _write(tmp_path / "p.csv", BAD_LONG)
    gz_path = tmp_path / "p.csv.gz"
    gz_path.write_bytes(gzip.compress(csv_path.read_bytes()))
    text = pd.read_csv(csv_path, dtype=str)
    text_pq = tmp_path / "text.parquet"  # every column as text, bad cells included
    text.to_parquet(text_pq)
    cols = [*panel.PRICE_COLUMNS, "bad_cells"]
    base = read_prices(csv_path)
    pd.testing.assert_frame_equal(read_prices(gz_path)[cols], base[cols])
    pd.testing.assert_frame_equal(read_prices(text_pq)[cols], base[cols])

    # typed Parquet columns (timestamps, floats, integers) read like their CSV text
    clean = text[(text["close"] != "abc") & (text["date"] != "2020-13-01")]
    clean_csv = tmp_path / "clean.csv"
    clean.to_csv(clean_csv, index=False)
    typed_pq = tmp_path / "typed.parquet"
    clean.assign(
        date=pd.to_datetime(clean["date"]),
        close=clean["close"].astype(float),
        volume=clean["volume"].astype("int64"),
    ).to_parquet(typed_pq)
    pd.testing.assert_frame_equal(read_prices(typed_pq)[cols], read_prices(clean_csv)[cols])

    def stored(path: Path) -> pd.DataFrame:
        home = tmp_path / f"home-{path.name}"
        ingest([path], None, home=home, skip_bad_rows=True)
        return _stored(home)[0]

    from_csv = stored(csv_path)
    pd.testing.assert_frame_equal(stored(text_pq), from_csv)
    pd.testing.assert_frame_equal(stored(gz_path), from_csv)
    pd.testing.assert_frame_equal(stored(typed_pq), stored(clean_csv))


def test_wide_parquet_equals_wide_csv(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "date": ["2021-01-04", "2021-01-05", "2021-01-06"],
            "AAA": [1.0, np.nan, 1.5],
            "BBB": [2.0, 2.1, 2.2],
        }
    )
    csv_path = tmp_path / "w.csv"
    frame.to_csv(csv_path, index=False)
    pq_path = tmp_path / "w.parquet"
    frame.assign(date=pd.to_datetime(frame["date"])).to_parquet(pq_path)
    cols = panel.PRICE_COLUMNS
    a, b = read_prices(csv_path), read_prices(pq_path)
    assert len(a) == 5
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_merge_semantics(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _write(
        tmp_path / "first.csv",
        """
date,symbol,close
2021-01-04,AAA,10
2021-01-05,AAA,11
2021-01-04,BBB,20
""",
    )
    master1 = _write(
        tmp_path / "m1.csv",
        """
symbol,name,asset_type,gics_sector,gics_sub_industry,shares
AAA,Old A,stock,Energy,,100
BBB,Old B,stock,Utilities,,200
""",
    )
    second = _write(
        tmp_path / "second.csv",
        """
date,symbol,close
2021-01-05,AAA,11.5
2021-01-06,AAA,12
2021-01-05,CCC,30
""",
    )
    master2 = _write(
        tmp_path / "m2.csv",
        """
symbol,name,asset_type,gics_sector,gics_sub_industry,shares
AAA,New A,stock,Materials,,150
CCC,New C,stock,Financials,,300
""",
    )
    assert ingest([first], master1, home=home).ok
    report = ingest([second], master2, home=home, merge=True)
    assert report.ok
    assert report.rows_kept == 3
    assert report.symbols == 3 and report.sessions == 3
    prices, master, meta = _stored(home)
    assert len(prices) == 5
    assert _price(prices, "AAA", "2021-01-04") == 10  # old row kept
    assert _price(prices, "AAA", "2021-01-05") == 11.5  # new row replaces the old one
    assert _price(prices, "AAA", "2021-01-06") == 12
    assert _price(prices, "BBB", "2021-01-04") == 20
    assert _price(prices, "CCC", "2021-01-05") == 30
    master = master.set_index("symbol")
    assert sorted(master.index) == ["AAA", "BBB", "CCC"]
    assert master.loc["AAA", "name"] == "New A" and master.loc["AAA", "shares"] == 150
    assert master.loc["BBB", "name"] == "Old B"
    assert meta["data_source"] == "first"  # the data set keeps its source's name
    assert meta["merged_files"] == [str(second), str(master2)]

    # merge without a master keeps the merged one; a jump across old and new data is flagged
    jump = _write(tmp_path / "jump.csv", "date,symbol,close\n2021-01-07,BBB,40\n")
    report = ingest([jump], None, home=home, merge=True, data_source="mine")
    assert report.rows_flagged == 1
    prices, master2_, meta = _stored(home)
    assert len(prices) == 6 and len(master2_) == 3 and meta["data_source"] == "mine"

    # without merge the data set is replaced; no master given keeps the previous master
    report = ingest([first], None, home=home)
    prices, master3, _ = _stored(home)
    assert len(prices) == 3
    assert _price(prices, "AAA", "2021-01-05") == 11
    assert sorted(master3["symbol"]) == ["AAA", "BBB", "CCC"]


def test_master_validation(tmp_path: Path) -> None:
    prices_path = _write(
        tmp_path / "p.csv",
        """
date,symbol,close
2021-01-04,AAA,10
2021-01-05,AAA,12.5
2021-01-04,BBB,5
2021-01-04,SPY,370
2021-01-04,DDD,1
""",
    )
    master_path = _write(
        tmp_path / "m.csv",
        """
Symbol,Security,GICS Sector,GICS Sub-Industry,Kind,Market Cap
aaa,A Inc,information technology,Semiconductors,stock,4000
BBB,B Inc,Tech,,fund,x
AAA,A again,Energy,,stock,1
DDD,D Inc,Energy,,,-3
,nameless,Energy,,stock,1
""",
    )
    report = ingest([prices_path], master_path, home=tmp_path / "home")
    assert not report.ok  # BAD_ASSET_TYPE is an error
    assert report.rows_rejected == 0
    assert _codes(report) == {
        "BAD_ASSET_TYPE": 1,
        "UNKNOWN_SECTOR": 1,
        "DUPLICATE_MASTER_ROW": 1,
        "MASTER_NO_SYMBOL": 1,
        "BAD_SHARES": 2,
        "PARTIAL_CAPS": 2,  # BBB and DDD have no cap while AAA has one (issue 12)
        "LEVEL_MISSING": 3,  # no sector ETF in the prices, each stock alone in its sector
    }
    levels = pd.read_csv(Path(report.report_dir) / "levels.csv")
    assert dict(zip(levels["symbol"], levels["level"], strict=True)) == {
        "AAA": "L2+L3",
        "BBB": "L2+L3",
        "DDD": "L2+L3",
    }
    assert _issue(report, "PARTIAL_CAPS")["examples"] == ["BBB", "DDD"]
    assert _issue(report, "BAD_ASSET_TYPE")["examples"] == [{"symbol": "BBB", "asset_type": "fund"}]
    assert _issue(report, "UNKNOWN_SECTOR")["examples"] == [
        {"symbol": "BBB", "gics_sector": "Tech"}
    ]
    _, master, _ = _stored(tmp_path / "home")
    master = master.set_index("symbol")
    assert sorted(master.index) == ["AAA", "BBB", "DDD"]  # SPY needs no master row
    assert master.loc["AAA", "gics_sector"] == "Information Technology"
    assert master.loc["AAA", "shares"] == 320  # 4000 / latest price 12.5
    assert master.loc["BBB", "asset_type"] == "stock"
    assert pd.isna(master.loc["BBB", "shares"]) and pd.isna(master.loc["DDD", "shares"])


def test_empty_and_malformed_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    good = _write(tmp_path / "good.csv", "date,symbol,close\n2021-01-04,AAA,10\n")
    header_only = _write(tmp_path / "empty.csv", "date,symbol,close\n")
    report = ingest([good, header_only], None, home=home)
    assert not report.ok
    assert _codes(report) == {"EMPTY": 1}
    assert _issue(report, "EMPTY")["examples"][0]["file"].endswith("empty.csv")
    assert len(_stored(home)[0]) == 1

    # nothing usable at all: the data set on disk is left as it was
    all_bad = _write(tmp_path / "bad.csv", "date,symbol,close\n2021-01-02,AAA,10\n")
    report = ingest([all_bad], None, home=home, skip_bad_rows=True)
    assert _codes(report) == {"NOT_A_SESSION": 1, "EMPTY": 1, "NO_DATA": 1}
    assert report.symbols == 0 and report.first_date is None
    assert _price(_stored(home)[0], "AAA", "2021-01-04") == 10

    ragged = _write(
        tmp_path / "ragged.csv",
        """
date,symbol,close
2021-01-04,AAA,10
2021-01-05,AAA
2021-01-06,AAA,11
2021-01-07,AAA,x
""",
    )
    report = ingest([ragged], None, home=home, skip_bad_rows=True)
    assert _codes(report) == {"MALFORMED_ROW": 1, "NON_NUMERIC_PRICE": 1}
    assert report.rows_read == 4 and report.rows_rejected == 2
    rejected = pd.read_csv(
        Path(report.report_dir) / "rejected.csv", dtype=str, keep_default_na=False
    )
    assert rejected[["row", "reason"]].values.tolist() == [
        ["3", "MALFORMED_ROW"],
        ["5", "NON_NUMERIC_PRICE"],
    ]
    assert rejected["detail"].iloc[0] == "2021-01-05,AAA"


def test_unrecognised_files_raise(tmp_path: Path) -> None:
    home = tmp_path / "home"
    odd = _write(tmp_path / "odd.csv", "foo,bar\n1,2\n")
    with pytest.raises(IngestError, match="date") as err:
        ingest([odd], None, home=home)
    assert "adjusted_close" in str(err.value) and "symbol" in str(err.value)
    no_close = _write(tmp_path / "noclose.csv", "date,symbol,open\n2021-01-04,A,1\n")
    with pytest.raises(IngestError, match="adjusted_close"):
        read_prices(no_close)
    no_symbol = _write(tmp_path / "nosym.csv", "date,close,volume\n2021-01-04,1,2\n")
    # No symbol column: one symbol's file, named by the file (issue 12; was an error).
    assert read_prices(no_symbol)["symbol"].tolist() == ["NOSYM"]
    with pytest.raises(IngestError, match=r"\.parquet"):
        read_prices(_write(tmp_path / "prices.xlsx", "x"))
    with pytest.raises(IngestError):
        read_prices(_write(tmp_path / "zero.csv", ""))
    bad_master = _write(tmp_path / "m.csv", "name,sector\nA,Energy\n")
    good = _write(tmp_path / "good.csv", "date,symbol,close\n2021-01-04,AAA,10\n")
    with pytest.raises(IngestError, match="symbol"):
        ingest([good], bad_master, home=home)
    assert not (home / "ingested").exists()  # nothing written
    assert issubclass(IngestError, ValueError)


# --------------------------------------------------------------------------------------------
# Share counts (--shares)

SHARE_PRICES = """
date,symbol,close
2024-01-02,AAA,10
2024-01-03,AAA,12
2024-01-02,BBB,50
2024-01-03,BBB,40
2024-01-02,CCC,5
2024-01-03,CCC,4
"""
SHARE_MASTER = """
symbol,name,gics_sector,gics_sub_industry,shares
AAA,Alpha,Energy,Oil & Gas Exploration & Production,1000
BBB,Beta,Energy,Oil & Gas Exploration & Production,
CCC,Gamma,Energy,Oil & Gas Exploration & Production,
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("symbol,shares\nAAA,250\nbbb,300\n", {"AAA": 250.0, "BBB": 300.0}),
        ("Ticker,Market Cap,Price\nAAA,5000,20\nBBB,900,3\n", {"AAA": 250.0, "BBB": 300.0}),
        # market cap without a price: divided by the latest (2024-01-03) close
        ("symbol,market_cap\nAAA,3000\nBBB,12000\n", {"AAA": 250.0, "BBB": 300.0}),
    ],
)
def test_a_share_file_sets_the_masters_shares(tmp_path: Path, text: str, expected: dict) -> None:
    prices = _write(tmp_path / "p.csv", SHARE_PRICES)
    master = _write(tmp_path / "m.csv", SHARE_MASTER)
    shares = _write(tmp_path / "shares.csv", text)
    report = ingest([prices], master, home=tmp_path / "home", shares=shares)
    assert report.ok, report.issues
    assert report.shares == {
        "file": str(shares),
        "rows": 2,
        "symbols_with_shares": 2,
        "unmatched": 0,
    }
    stored = _stored(tmp_path / "home")[1].set_index("symbol")["shares"]
    assert stored["AAA"] == expected["AAA"]  # the file wins over the master's 1000
    assert stored["BBB"] == expected["BBB"]
    assert np.isnan(stored["CCC"])  # not in the file, none in the master
    assert str(shares) in json.loads((Path(report.report_dir) / "report.json").read_text())["files"]


def test_a_share_file_reports_bad_and_unmatched_rows(tmp_path: Path) -> None:
    prices = _write(tmp_path / "p.csv", SHARE_PRICES)
    master = _write(tmp_path / "m.csv", SHARE_MASTER)
    shares = _write(tmp_path / "s.csv", "symbol,shares\nAAA,-5\nBBB,lots\nCCC,70\nZZZ,10\nAAA,99\n")
    report = ingest([prices], master, home=tmp_path / "home", shares=shares)
    assert report.ok  # warnings only
    assert _count(report, "BAD_SHARES") == 2 and _count(report, "SHARES_UNMATCHED") == 1
    assert _issue(report, "SHARES_UNMATCHED")["examples"] == ["ZZZ"]
    # AAA's first row is bad, so its later row counts; BBB keeps nothing from the file
    assert report.shares["symbols_with_shares"] == 2
    stored = _stored(tmp_path / "home")[1].set_index("symbol")["shares"]
    assert stored["AAA"] == 99 and np.isnan(stored["BBB"]) and stored["CCC"] == 70
    console = Console(record=True, width=200)
    render_report(report, console)
    assert "2 symbols got a share count from s.csv" in console.export_text()


def test_a_file_that_is_no_share_file_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    prices = _write(tmp_path / "p.csv", SHARE_PRICES)
    bad = _write(tmp_path / "s.csv", "symbol,price\nAAA,10\n")
    with pytest.raises(IngestError, match=r"not a share-count file.*market_cap"):
        ingest([prices], None, home=tmp_path / "home", shares=bad)
    assert not (tmp_path / "home" / "ingested").exists()


@needs_data
def test_the_sp_financials_file_is_read_as_is() -> None:
    from eqrisk.data.master_files import read_shares

    counts = read_shares(DATA / "constituents_financials.csv").set_index("symbol")
    raw = pd.read_csv(DATA / "constituents_financials.csv").set_index("Symbol")
    both = raw.dropna(subset=["Market Cap", "Price"])
    assert len(counts) == len(both) > 400
    assert np.allclose(counts.loc[both.index, "shares"], both["Market Cap"] / both["Price"])


def test_the_ingest_command_takes_a_share_file_and_reports_it(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    prices = _write(tmp_path / "p.csv", SHARE_PRICES)
    master = _write(tmp_path / "m.csv", SHARE_MASTER)
    shares = _write(tmp_path / "s.csv", "symbol,shares\nAAA,250\nCCC,70\n")
    args = [str(prices), "--master", str(master), "--shares", str(shares)]
    env = {**os.environ, "EQRISK_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "eqrisk.cli", "ingest"]
    proc = subprocess.run([*cli, *args, "--json"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["shares"]["symbols_with_shares"] == 2
    human = subprocess.run([*cli, *args], env=env, capture_output=True, text=True)
    assert "2 symbols got a share count from s.csv" in " ".join(human.stdout.split())  # result
    missing = subprocess.run(
        [*cli, str(prices), "--shares", str(tmp_path / "nope.csv")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "nope.csv" in missing.stderr
