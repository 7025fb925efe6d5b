"""The daily job of docs/DEPLOYMENT.md on real prices, run as written: `eqrisk update FILE --json`
once a session. Adjusted closes of the real file (energy names, SPY, XLE), ingested through
2020-02-28 with --prices adjusted, then one file per session from 2020-03-02 to 2020-03-10:
every build is incremental, every merge windowed, no return of the first ingest changes, and
OXY's -52% of 2020-03-09 stays a return in the data set and in the served version."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.data import ingested
from eqrisk.snapshot.versions import Snapshot, current_version, snapshots_dir
from helpers import SHARED_DATA, eqrisk_cli

WIDE = SHARED_DATA / "adjclose_wide_2010_2026.csv.gz"
MASTER = SHARED_DATA / "gics_constituents.csv"
pytestmark = pytest.mark.skipif(not WIDE.exists(), reason="needs ../shared/data")


def _eqrisk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return eqrisk_cli(home, *args, timeout=600, cwd=home.parent)


def _returns(home: Path) -> pd.Series:
    prices, _, meta = ingested.read_ingested(home)
    r = prices.groupby("symbol")["close"].pct_change()
    out = pd.Series(r.to_numpy(), index=pd.MultiIndex.from_arrays(
        [prices["symbol"], prices["date"].astype(str)]))  # fmt: skip
    for symbol, day in meta["return_breaks"]:
        out[(symbol, day)] = np.nan
    return out


def test_the_documented_daily_job_on_real_prices(tmp_path: Path) -> None:
    wide = pd.read_csv(WIDE, dtype={"date": str})
    gics = pd.read_csv(MASTER)
    energy = gics.loc[gics["GICS Sector"] == "Energy", "Symbol"].tolist()
    cols = ["date", "SPY", "XLE", *[s for s in energy if s in wide.columns]]
    wide = wide.loc[wide["date"].between("2018-01-02", "2020-03-10"), cols]
    home = tmp_path / "home"
    first = tmp_path / "first.csv"
    wide[wide["date"] < "2020-03-02"].to_csv(first, index=False)
    done = _eqrisk(home, "ingest", str(first), "--master", str(MASTER), "--prices", "adjusted")
    assert done.returncode == 0, done.stderr
    assert _eqrisk(home, "build").returncode == 0
    before = _returns(home)

    days = wide.loc[wide["date"] >= "2020-03-02", "date"].tolist()
    assert len(days) == 7
    for day in days:
        path = tmp_path / f"{day}.csv"
        wide[wide["date"] == day].to_csv(path, index=False)
        job = _eqrisk(home, "update", str(path), "--json")
        assert job.returncode == 0, job.stderr
        summary = json.loads(job.stdout)
        assert summary["build"]["mode"] == "incremental", (day, summary["build"])
        assert summary["data_as_of"] == day
        assert "rewriting the whole data set" not in job.stderr

    after = _returns(home)
    pd.testing.assert_series_equal(after.reindex(before.index), before)
    oxy = wide.set_index("date")["OXY"]
    move = oxy["2020-03-09"] / oxy["2020-03-06"] - 1
    assert move < -0.5 and after[("OXY", "2020-03-09")] == pytest.approx(move, rel=1e-12)
    snap = Snapshot.open(snapshots_dir(home) / str(current_version(home)))
    t = list(pd.DatetimeIndex(snap.sessions).strftime("%Y-%m-%d")).index("2020-03-09")
    served = float(np.asarray(snap.array("return"))[snap.row_of["OXY"], t])
    assert served == pytest.approx(move, rel=1e-9)
