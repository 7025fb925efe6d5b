"""All or nothing (issue 33): an ingest or update either takes its whole input or changes
nothing of the data set (its files, meta and versions byte-identical); `--skip-bad-rows` takes
the good rows and says how many; a stated date format the column contradicts is refused; a
missing home is refused by the commands that need one; symbols outside the documented set are
rejected rows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from eqrisk.data.calendar import sessions_between
from eqrisk.data.dates import DateFormatError
from eqrisk.data.ingest import ingest
from eqrisk.data.ingest_report import IngestRefused
from eqrisk.data.ingested import read_ingested
from eqrisk.data.row_checks import bad_symbols
from helpers import tree_hash

SYMBOLS = ["AAA", "BBB", "CCC", "DDD"]


def _frame(start: str, end: str, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    days = sessions_between(pd.Timestamp(start), pd.Timestamp(end))
    closes = 20 * np.exp(np.cumsum(rng.normal(0, 0.01, (len(SYMBOLS), len(days))), axis=1))
    return pd.DataFrame({"date": np.tile(days.strftime("%Y-%m-%d"), len(SYMBOLS)),
                         "symbol": np.repeat(SYMBOLS, len(days)), "close": closes.ravel()})  # fmt: skip


def _eqrisk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "EQRISK_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "300"},
    )


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    base = tmp_path / "home"
    first = tmp_path / "first.csv"
    _frame("2022-01-03", "2022-03-31").to_csv(first, index=False)
    assert ingest([first], None, home=base).ok
    return base


def test_a_merge_with_bad_rows_changes_nothing_unless_skip_bad_rows(
    home: Path, tmp_path: Path
) -> None:
    new = _frame("2022-04-01", "2022-04-08", seed=4).astype({"close": object})
    new.loc[2, "close"] = "12,5x"
    new.loc[5, "close"] = -3.0
    path = tmp_path / "new.csv"
    new.to_csv(path, index=False)
    before = tree_hash(home)
    with pytest.raises(IngestRefused) as refused:
        ingest([path], None, home=home, merge=True)
    message = str(refused.value)
    assert "2 of 24 rows rejected" in message and "--skip-bad-rows" in message
    assert "1 NON_NUMERIC_PRICE" in message and "1 NON_POSITIVE_PRICE" in message
    assert tree_hash(home) == before

    report = ingest([path], None, home=home, merge=True, skip_bad_rows=True)
    assert (report.rows_kept, report.rows_rejected) == (22, 2)
    prices, _, _ = read_ingested(home)
    prices["date"] = pd.to_datetime(prices["date"])
    assert prices["date"].max() == pd.Timestamp("2022-04-08")
    assert len(prices[prices["date"] >= pd.Timestamp("2022-04-01")]) == 22


def _demo_copy(demo_home: Path, target: Path) -> Path:
    """The demo home's data set copied and its versions hard-linked (a refused command writes
    none of them; the hash of the tree says so)."""
    target.mkdir()
    shutil.copytree(demo_home / "ingested", target / "ingested")
    shutil.copytree(demo_home / "snapshots", target / "snapshots", copy_function=os.link)
    return target


def test_cli_update_with_a_bad_row_exits_1_and_changes_nothing(
    demo_home: Path, tmp_path: Path
) -> None:
    home = _demo_copy(demo_home, tmp_path / "home")
    prices, _, _ = read_ingested(home)
    last = prices[prices["date"] == prices["date"].max()]
    day = pd.DataFrame({"date": "2026-11-02", "symbol": last["symbol"].to_numpy(),
                        "close": last["close"].to_numpy() * 1.01})  # fmt: skip
    day.loc[3, "symbol"] = "=HYPERLINK(X)"
    path = tmp_path / "day.csv"
    day.to_csv(path, index=False)
    before = tree_hash(home)
    assert any(name.startswith("snapshots/") for name in before)
    proc = _eqrisk(home, "update", str(path))
    assert proc.returncode == 1, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"1 of {len(day)} rows rejected (1 BAD_SYMBOL" in said and "nothing was taken" in said
    assert tree_hash(home) == before


def test_skip_bad_rows_takes_the_good_rows_and_says_so(home: Path, tmp_path: Path) -> None:
    new = _frame("2022-04-01", "2022-04-05", seed=5)
    new.loc[0, "symbol"] = "<SCRIPT>"
    path = tmp_path / "day.csv"
    new.to_csv(path, index=False)
    proc = _eqrisk(home, "ingest", "--merge", "--skip-bad-rows", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "took 11 good rows of 12" in " ".join(proc.stderr.split())
    assert "<SCRIPT>" not in set(read_ingested(home)[0]["symbol"])


def test_a_stated_date_format_the_column_contradicts_is_refused(home: Path, tmp_path: Path) -> None:
    new = _frame("2022-04-01", "2022-04-29", seed=6)
    new["date"] = pd.to_datetime(new["date"]).dt.strftime("%d/%m/%Y")  # day first
    path = tmp_path / "ddmm.csv"
    new.to_csv(path, index=False)
    before = tree_hash(home)
    with pytest.raises(DateFormatError, match="DD/MM/YYYY reads every value"):
        ingest([path], None, home=home, date_format="MM/DD/YYYY", skip_bad_rows=True, replace=True)
    assert tree_hash(home) == before
    fresh = tmp_path / "fresh"
    with pytest.raises(DateFormatError):
        ingest([path], None, home=fresh, date_format="MM/DD/YYYY")
    assert not fresh.exists()
    # The right one is taken.
    assert ingest([path], None, home=fresh, date_format="DD/MM/YYYY").ok
    dates = pd.to_datetime(read_ingested(fresh)[0]["date"])
    assert (dates.min(), dates.max()) == (pd.Timestamp("2022-04-01"), pd.Timestamp("2022-04-29"))


def test_commands_that_need_a_home_refuse_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eqrisk.cli import app
    from eqrisk.settings import get_settings

    typo = tmp_path / "hoem"
    path = tmp_path / "day.csv"
    _frame("2022-04-01", "2022-04-01").to_csv(path, index=False)
    monkeypatch.setenv("EQRISK_HOME", str(typo))
    get_settings.cache_clear()
    try:
        for args in (
            ["update", str(path)],
            ["build"],
            ["snapshots"],
            ["fetch", "--provider", "yahoo"],
        ):
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 3, (args, result.output)
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and f"EQRISK_HOME {typo} does not exist" in lines[0], lines
            assert not typo.exists()
    finally:
        get_settings.cache_clear()


def test_the_symbol_set() -> None:
    good = ["BRK.B", "BF-B", "AAPL", "^GSPC", "RDS/A", "X_1", "3988"]
    bad = ["<SCRIPT>", "=HYPERLINK(1)", "+1", "-A", "@SUM", "A\x00B", "A B", "A'", "X" * 21]
    flags = bad_symbols(np.array(good + bad + [""], dtype=object))
    assert flags.tolist() == [False] * len(good) + [True] * len(bad) + [False]
