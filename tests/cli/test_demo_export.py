"""`eqrisk demo --export DIR`: the demo market as the files a user ingests. Ingesting them with
the README's commands gives the demo's own data set, value for value."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from eqrisk.data.demo import EXPORT_NEW_DAYS, generate_demo, write_demo_files
from eqrisk.data.ingest import ingest
from eqrisk.data.ingested import read_ingested
from helpers import eqrisk_cli


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return eqrisk_cli(home, *args, inherit=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the folder, the printed file paths, the home the command ran with)."""
    root = tmp_path_factory.mktemp("export")
    home = root / "untouched-home"
    proc = run(home, "demo", "--export", str(root / "demo-data"), "--json")
    assert proc.returncode == 0, proc.stderr
    return root / "demo-data", json.loads(proc.stdout)["files"], home


def test_export_writes_three_files_and_touches_no_home(exported) -> None:
    folder, files, home = exported
    assert files == {
        "prices": str(folder / "prices.csv.gz"),
        "new_days": str(folder / "new_days.csv"),
        "master": str(folder / "master.csv"),
    }
    assert not home.exists()  # no build, no account, nothing under EQRISK_HOME
    prices = pd.read_csv(files["prices"])
    new_days = pd.read_csv(files["new_days"])
    assert list(prices.columns) == list(new_days.columns) == [
        "date", "symbol", "open", "high", "low", "close", "adjusted_close", "volume"
    ]  # fmt: skip
    assert new_days["date"].nunique() == EXPORT_NEW_DAYS
    assert prices["date"].max() < new_days["date"].min()  # the held-back sessions follow
    master = pd.read_csv(files["master"])
    assert list(master.columns) == [
        "symbol", "name", "asset_type", "gics_sector", "gics_sub_industry", "shares"
    ]  # fmt: skip


def test_ingesting_the_export_reproduces_the_demo_data_set(exported, tmp_path: Path) -> None:
    """The README's path (ingest the prices with the master, then merge the new days, as
    `eqrisk update` does) against the demo's own path (`build_demo`'s vendor files ingested),
    compared on every stored value."""
    _, files, _ = exported
    mine = tmp_path / "mine"
    first = run(mine, "ingest", files["prices"], "--master", files["master"], "--json")
    assert first.returncode == 0, first.stderr
    merged = run(mine, "ingest", files["new_days"], "--merge", "--json")
    assert merged.returncode == 0, merged.stderr

    demo = tmp_path / "demo"
    market = generate_demo(seed=7)
    demo_files = write_demo_files(market, demo / "demo")
    assert ingest([demo_files["prices"]], demo_files["master"], home=demo).ok

    got_prices, got_master, got_meta = read_ingested(mine)
    want_prices, want_master, want_meta = read_ingested(demo)
    assert len(want_prices) == len(market.prices) > 500_000
    key = ["symbol", "date"]
    got_prices = got_prices.sort_values(key).reset_index(drop=True)
    want_prices = want_prices.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got_prices, want_prices, check_exact=True)
    pd.testing.assert_frame_equal(
        got_master.sort_values("symbol").reset_index(drop=True),
        want_master.sort_values("symbol").reset_index(drop=True),
        check_exact=True,
    )
    assert got_meta["return_breaks"] == want_meta["return_breaks"]
    # and independently of the ingest: the adjusted closes are the generator's own
    adjusted = got_prices.pivot(index="date", columns="symbol", values="close")
    expected = market.prices.assign(date=pd.to_datetime(market.prices["date"]).dt.date).pivot(
        index="date", columns="symbol", values="close"
    )
    assert adjusted.shape == expected.shape
    assert (adjusted.to_numpy() == expected.loc[adjusted.index, adjusted.columns].to_numpy())[
        expected.notna().to_numpy()
    ].all()
