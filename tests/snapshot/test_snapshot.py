"""Versioned snapshots: content, the spec's tables, immutability and the atomic switch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.panel import Panel
from eqrisk.model.run import ModelParams
from eqrisk.snapshot import tables
from eqrisk.snapshot.versions import (
    Snapshot,
    SnapshotStore,
    current_version,
    list_versions,
    snapshots_dir,
)

SPEC_SYMBOL_COLUMNS = [
    "ticker",
    "asset_type",
    "latest_teo",
    "latest_vol",
    "latest_er_total",
    "latest_hr_mkt",
    "metadata",
    "latest_metrics",
]
SPEC_METRIC_KEYS = {
    "return",
    "L3_market_HR",
    "L3_sector_HR",
    "L3_subsector_HR",
    "L3_market_ER",
    "L3_residual_risk",
}


@pytest.fixture()
def home(demo_home: Path, tmp_path: Path) -> Path:
    """A private copy of the demo home (its ingested data and first snapshot)."""
    target = tmp_path / "home"
    shutil.copytree(demo_home, target)
    return target


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def test_manifest_says_what_was_built(demo_home: Path) -> None:
    snap = SnapshotStore(demo_home).current()
    m = snap.manifest
    assert m["data_source"] == "demo-synthetic"
    assert m["model_version"] == current_version(demo_home)
    assert m["method"]["window"] == 252 and m["method"]["min_obs"] == 126
    assert m["method"]["weighting"] == "equal"
    assert m["data_as_of"] == str(snap.sessions[-1])
    assert m["universe_size"] == len(snap.symbols) >= 150 + 27
    assert snap.metadata()["model_version"] == m["model_version"]


def test_symbols_table_has_the_spec_fields(demo_home: Path) -> None:
    snap = SnapshotStore(demo_home).current()
    table = snap.symbols
    assert list(table.columns[: len(SPEC_SYMBOL_COLUMNS)]) == SPEC_SYMBOL_COLUMNS
    assert set(table["asset_type"]) == {"stock", "etf"}
    nvda = table.loc["NVDA"]
    i = int(nvda["row"])
    meta = json.loads(nvda["metadata"])
    assert meta["company_name"] == "NVIDIA Corporation" or "NVIDIA" in meta["company_name"]
    assert {meta["sector_etf"], meta["subsector_etf"]} == {"XLK", "SMH"}
    t = len(snap.sessions) - 1
    assert nvda["latest_teo"] == snap.sessions[t].astype(object)
    assert nvda["latest_hr_mkt"] == snap.array("l3_mkt_hr")[i, t]
    assert nvda["latest_er_total"] == pytest.approx(1 - snap.array("l3_res_er")[i, t], abs=1e-15)
    latest = json.loads(nvda["latest_metrics"])
    assert latest["vol_23d"] == snap.array("vol_23d")[i, t]


def test_security_history_long_table_matches_the_arrays(demo_home: Path) -> None:
    snap = SnapshotStore(demo_home).current()
    hist = snap.security_history(symbol="MSFT")
    assert set(hist["periodicity"].astype(str)) == {"daily", "monthly"}
    assert set(hist["metric_key"].astype(str)) >= SPEC_METRIC_KEYS
    i = snap.row_of["MSFT"]
    daily = hist[hist["periodicity"] == "daily"]
    hr = daily[daily["metric_key"] == "L3_market_HR"].set_index("teo")["value"]
    arr = snap.array("l3_mkt_hr")[i]
    published = np.isfinite(arr)
    assert len(hr) == published.sum()
    np.testing.assert_array_equal(hr.to_numpy(), arr[published])
    # Monthly: the log return of the month is the sum of its daily log returns.
    monthly = hist[(hist["periodicity"] == "monthly") & (hist["metric_key"] == "return")]
    logr = pd.Series(snap.array("log_return")[i], index=pd.DatetimeIndex(snap.sessions))
    by_month = logr.groupby(logr.index.to_period("M")).sum(min_count=1).dropna()
    assert len(monthly) == len(by_month)
    np.testing.assert_allclose(monthly["value"].to_numpy(), by_month.to_numpy(), rtol=1e-12)
    # Monthly levels are the month's last published value, dated at the month's last session.
    mhr = hist[(hist["periodicity"] == "monthly") & (hist["metric_key"] == "L3_market_HR")]
    last = mhr.iloc[-1]
    assert last["teo"] == snap.sessions[-1].astype(object)
    assert last["value"] == arr[-1]


def test_a_new_build_is_a_new_version_and_the_old_stays_intact(home: Path) -> None:
    first = current_version(home)
    before = _digest(snapshots_dir(home) / first)
    store = SnapshotStore(home)
    assert store.current().version == first
    manifest = build_snapshot(home, ModelParams(window=200, min_obs=100))
    second = manifest["model_version"]
    assert second != first and current_version(home) == second
    assert list_versions(home) == [first, second]
    assert _digest(snapshots_dir(home) / first) == before
    # A running server's store picks the new version up without a restart.
    assert store.current().version == second
    assert store.current().manifest["method"]["window"] == 200


def test_a_failed_build_leaves_the_current_version_served(home: Path, monkeypatch) -> None:
    first = current_version(home)
    before = _digest(snapshots_dir(home) / first)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tables, "write_security_history", boom)
    with pytest.raises(OSError, match="disk full"):
        build_snapshot(home, ModelParams())
    assert current_version(home) == first
    assert list_versions(home) == [first]
    assert not list(snapshots_dir(home).glob(".building-*"))
    assert _digest(snapshots_dir(home) / first) == before
    assert Snapshot.open(snapshots_dir(home) / first).array("l3_mkt_hr").shape[0] > 0


def test_a_killed_build_leaves_the_current_version_served(home: Path) -> None:
    first = current_version(home)
    before = _digest(snapshots_dir(home) / first)
    env = {**os.environ, "EQRISK_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqrisk.cli", "build", "--force"],  # the same data again
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = snapshots_dir(home)
    deadline = time.monotonic() + 120
    try:
        while not list(root.glob(".building-*/arrays/*/*.npy")):
            assert proc.poll() is None, "the build finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert current_version(home) == first
    assert list_versions(home) == [first]
    assert _digest(root / first) == before
    # The next build clears the debris and publishes normally.
    manifest = build_snapshot(home, ModelParams())
    assert current_version(home) == manifest["model_version"] != first
    assert not list(root.glob(".building-*"))


def test_old_versions_are_pruned_but_never_the_current(home: Path) -> None:
    for _ in range(3):
        build_snapshot(home, ModelParams(), keep=2)
    versions = list_versions(home)
    assert len(versions) == 2
    assert current_version(home) == versions[-1]


def test_store_without_snapshot_says_how_to_get_one(tmp_path: Path) -> None:
    from eqrisk.snapshot.versions import SnapshotError

    with pytest.raises(SnapshotError, match="eqrisk build"):
        SnapshotStore(tmp_path).current()


def test_monthly_views_of_levels_and_flows() -> None:
    sessions = np.array(
        ["2024-01-30", "2024-01-31", "2024-02-01", "2024-02-02"], dtype="datetime64[D]"
    )
    level = np.array([[[1.0, np.nan, 3.0, np.nan]]])
    got, dates = tables.monthly_views(sessions, level, flow=False)
    np.testing.assert_array_equal(got, [[[1.0, 3.0]]])
    assert [str(d) for d in dates] == ["2024-01-31", "2024-02-02"]
    flow = np.array([[[0.01, 0.02, np.nan, np.nan]]])
    got, _ = tables.monthly_views(sessions, flow, flow=True)
    assert got[0, 0, 0] == pytest.approx(0.03) and np.isnan(got[0, 0, 1])


def _numpy_month_last(sessions: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The last finite value of each series within each month, month by month in numpy."""
    months = sessions.astype("datetime64[M]")
    starts = np.flatnonzero(np.r_[True, months[1:] != months[:-1]])
    ends = np.r_[starts[1:], len(sessions)]
    out = np.empty((*level.shape[:-1], len(starts)))
    for m, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        month = level[..., lo:hi]
        finite = np.isfinite(month)
        last = (hi - lo - 1) - np.argmax(finite[..., ::-1], axis=-1)
        picked = np.take_along_axis(month, last[..., None], axis=-1)[..., 0]
        out[..., m] = np.where(finite.any(axis=-1), picked, np.nan)
    return out


def test_monthly_levels_equal_numpy_month_by_month(
    real_universe: tuple[Panel, pd.DataFrame],
) -> None:
    """The month-end levels of real closes, and of series whose months end in gaps, hold only
    infinities or nothing, or have one session: numpy's pick, bit for bit."""
    panel, _ = real_universe
    real = np.stack([panel.close[:200], panel.close[200:400]], axis=1)  # (rows x keys x T)
    got, dates = tables.monthly_views(panel.sessions, real, flow=False)
    assert np.array_equal(got, _numpy_month_last(panel.sessions, real), equal_nan=True)
    assert len(dates) == got.shape[-1] and np.isfinite(got).mean() > 0.5
    sessions = np.array(
        ["2024-01-30", "2024-01-31", "2024-02-01", "2024-02-29", "2024-03-01"],
        dtype="datetime64[D]",
    )
    rng = np.random.default_rng(2)
    level = rng.normal(size=(6, 3, 5))
    level[0, :, 1] = np.nan  # January ends in a gap
    level[1, :, :2] = np.inf  # January holds infinities only
    level[2, :, 2:4] = np.nan  # February holds nothing
    level[3, 0] = np.nan
    got, _ = tables.monthly_views(sessions, level, flow=False)
    assert np.array_equal(got, _numpy_month_last(sessions, level), equal_nan=True)
    assert got[0, 0, 0] == level[0, 0, 0] and np.isnan(got[1, :, 0]).all()
    assert np.isnan(got[2, :, 1]).all() and got[4, 1, 2] == level[4, 1, 4]
