"""The ingested data set as partitions (symbol block x year): a merge reads and writes only what
it touches and ends where the same merge over the whole history ends.

Real prices (the OHLCV file: opens and volumes give the cleaning stage its full evidence), 2018
to 2020, dealt into blocks of 100 symbols so that the data set has several blocks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eqrisk.data import ingested
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestReport
from eqrisk.data.panel import PRICE_COLUMNS, to_panel
from helpers import SHARED_DATA

LONG = SHARED_DATA / "ohlcv_long_2010_2020.csv.gz"
MASTER = SHARED_DATA / "gics_constituents.csv"
pytestmark = pytest.mark.skipif(not LONG.exists(), reason="needs ../shared/data")


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    frame = pd.read_csv(LONG, dtype={"date": str})
    return frame[frame["date"].between("2018-01-02", "2020-12-31")].reset_index(drop=True)


@pytest.fixture(scope="module")
def base(rows: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data set through 2020-03-05, 100 symbols per block."""
    folder = tmp_path_factory.mktemp("base")
    first = folder / "first.csv"
    rows[rows["date"] <= "2020-03-05"].to_csv(first, index=False)
    ingest([first], MASTER, home=folder / "home", block_symbols=100)
    return folder / "home"


def _file(rows: pd.DataFrame, path: Path) -> Path:
    rows.to_csv(path, index=False)
    return path


def _both(
    base: Path, tmp: Path, files: list[Path]
) -> tuple[Path, Path, IngestReport, IngestReport, dict[str, int]]:
    """The merge of `files` windowed and over the whole history, each on a copy of `base`; and
    the windowed copy's partition files (inodes) before its merge."""
    window, whole = tmp / "window", tmp / "whole"
    shutil.copytree(base, window)
    shutil.copytree(base, whole)
    before = _inodes(window)
    a = ingest(files, None, home=window, merge=True)
    b = ingest(files, None, home=whole, merge=True, whole=True)
    return window, whole, a, b, before


def _same(window: Path, whole: Path, a: IngestReport, b: IngestReport) -> None:
    got, want = ingested.read_ingested(window), ingested.read_ingested(whole)
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])
    for key in ("return_breaks", "return_decisions", "counts", "basis", "data_source"):
        assert got[2][key] == want[2][key], key
    ra, rb = a.to_dict(), b.to_dict()
    for key in ("report_dir", "started_at", "finished_at"):
        ra.pop(key), rb.pop(key)
    assert ra == rb
    for name in ("flagged.csv", "return_decisions.csv", "rejected.csv"):
        left = pd.read_csv(Path(a.report_dir) / name)
        right = pd.read_csv(Path(b.report_dir) / name)
        pd.testing.assert_frame_equal(left, right)


def _inodes(home: Path) -> dict[str, int]:
    folder = ingested.ingested_dir(home) / "prices"
    return {str(p.relative_to(folder)): p.stat().st_ino for p in folder.rglob("*.parquet")}


def test_one_session_reads_and_writes_its_year_and_equals_the_whole_merge(
    rows: pd.DataFrame, base: Path, tmp_path: Path
) -> None:
    """2020-03-06 then 2020-03-09 (OXY -52%, a crash kept as a return): each merge rewrites the
    2020 file of each block and links the 2018 and 2019 files unchanged; verdicts, flags,
    counts and the stored rows equal the whole-history merge's."""
    day1 = _file(rows[rows["date"] == "2020-03-06"], tmp_path / "d1.csv")
    day2 = _file(rows[rows["date"] == "2020-03-09"], tmp_path / "d2.csv")
    before = _inodes(base)
    blocks = {k.split("/")[0] for k in before}
    n = rows.loc[rows["date"] <= "2020-03-05", "symbol"].nunique()
    assert len(blocks) == -(-n // 100) and {k.split("/")[1] for k in before} == {
        "2018.parquet", "2019.parquet", "2020.parquet"}  # fmt: skip
    window, whole, a, b, before = _both(base, tmp_path, [day1])
    _same(window, whole, a, b)
    after = _inodes(window)
    kept = {k for k in before if after[k] == before[k]}
    assert kept == {k for k in before if not k.endswith("2020.parquet")}
    a = ingest([day2], None, home=window, merge=True)
    b = ingest([day2], None, home=whole, merge=True, whole=True)
    _same(window, whole, a, b)
    prices, _, meta = ingested.read_ingested(window)
    oxy = prices[prices["symbol"] == "OXY"].set_index("date")["close"]
    day = pd.Timestamp("2020-03-09").date()
    assert oxy[day] / oxy[pd.Timestamp("2020-03-06").date()] - 1 < -0.5
    assert ["OXY", "2020-03-09"] not in meta["return_breaks"]
    n9, n6 = (int((rows["date"] == d).sum()) for d in ("2020-03-09", "2020-03-06"))
    assert n9 > 500 and a.coverage == [
        {"date": "2020-03-09", "symbols": n9, "previous": n6, "share": round(n9 / n6, 4)}]  # fmt: skip


def test_sessions_across_a_year_end_a_correction_and_a_new_symbol(
    rows: pd.DataFrame, base: Path, tmp_path: Path
) -> None:
    """A merge of later sessions (into 2021's partitions, new), a corrected close in the middle
    of 2019 and a symbol the data set did not have: the windowed merge equals the whole one;
    the new symbol goes to the last block (it has room) and the corrected row's partition is
    the only 2019 file rewritten."""
    later = rows[rows["date"].between("2020-03-06", "2020-12-31")].copy()
    late = later[later["date"] >= "2020-12-01"].copy()
    late["date"] = late["date"].str.replace("2020-12", "2021-01", regex=False)
    late = late[pd.to_datetime(late["date"]).dt.day_of_week < 5]
    late = late[~late["date"].isin(["2021-01-01", "2021-01-18"])]  # NYSE holidays
    fix = rows[(rows["symbol"] == "AAPL") & (rows["date"] == "2019-06-14")].copy()
    fix["adjusted_close"] = fix["adjusted_close"] * 1.01
    newcomer = rows[(rows["symbol"] == "MSFT") & (rows["date"] >= "2020-03-06")].copy()
    newcomer["symbol"] = "ZZZNEW"
    files = [_file(f, tmp_path / f"{n}.csv") for n, f in
             (("later", later), ("late", late), ("fix", fix), ("new", newcomer))]  # fmt: skip
    window, whole, a, b, before = _both(base, tmp_path, files)
    _same(window, whole, a, b)
    after = _inodes(window)
    blocks = ingested.stored(window)
    n = rows.loc[rows["date"] <= "2020-03-05", "symbol"].nunique()
    assert blocks is not None and blocks.stats.blocks()["ZZZNEW"] == n // 100
    aapl = blocks.stats.blocks()["AAPL"]
    rewritten = {k for k in before if after[k] != before[k]}
    assert {k for k in rewritten if k.endswith("2019.parquet")} == {f"{aapl:04d}/2019.parquet"}
    assert any(k.endswith("2021.parquet") for k in after)


def test_a_data_set_of_one_file_is_read_and_stored_partitioned_by_its_next_merge(
    rows: pd.DataFrame, tmp_path: Path
) -> None:
    """A data set written before partitions (one prices.parquet): read as it is, built into the
    same panel, and its next merge stores it partitioned with the same rows."""
    home = tmp_path / "home"
    part = rows[rows["symbol"].isin(["AAPL", "MSFT", "SPY", "XOM"])]
    ingest([_file(part[part["date"] <= "2019-12-31"], tmp_path / "a.csv")], MASTER, home=home)
    prices, master, meta = ingested.read_ingested(home)
    folder = ingested.ingested_dir(home)
    shutil.rmtree(folder / "prices")
    for name in ("index.parquet", "days.parquet"):
        os.remove(folder / name)
    schema = pa.schema([("date", pa.date32()), ("symbol", pa.string())]
                       + [(c, pa.float64()) for c in PRICE_COLUMNS[2:]])  # fmt: skip
    pq.write_table(pa.Table.from_pandas(prices, schema=schema, preserve_index=False),
                   folder / "prices.parquet")  # fmt: skip
    meta.pop("layout")
    (folder / "meta.json").write_text(json.dumps(meta))
    legacy = ingested.read_ingested(home)
    pd.testing.assert_frame_equal(legacy[0], prices)
    found = ingested.stored(home)
    assert found is not None and found.legacy
    panel = ingested.read_panel(found, master)
    expected = to_panel(prices, master)
    assert (panel.symbols == expected.symbols).all()
    pd.testing.assert_frame_equal(pd.DataFrame(panel.close), pd.DataFrame(expected.close))
    ingest([_file(part[part["date"] == "2020-01-02"], tmp_path / "b.csv")], None, home=home,
           merge=True)  # fmt: skip
    assert not (folder / "prices.parquet").exists()
    merged = ingested.read_ingested(home)[0]
    assert len(merged) == len(prices) + 4
    pd.testing.assert_frame_equal(merged[merged["date"] < pd.Timestamp("2020-01-01").date()]
                                  .reset_index(drop=True), prices)  # fmt: skip


def test_the_panel_read_block_by_block_equals_the_long_frame_pivoted(base: Path) -> None:
    found = ingested.stored(base)
    assert found is not None and not found.legacy
    prices, master, _ = ingested.read_ingested(base)
    got, want = ingested.read_panel(found, master), to_panel(prices, master)
    assert (got.symbols == want.symbols).all() and (got.sessions == want.sessions).all()
    for field in ("close", "open", "high", "low", "close_raw", "volume", "market_cap"):
        a, b = getattr(got, field), getattr(want, field)
        assert ((a == b) | (pd.isna(a) & pd.isna(b))).all(), field
