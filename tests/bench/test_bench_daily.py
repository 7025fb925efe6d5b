"""`eqrisk bench daily` runs the daily job end to end on a small universe: the job did what it
should (one more session, in the data set and in the incremental version, with the day file's
prices), and its figures are the child processes' and agree with each other (no timing is
asserted: speed is read from the bench)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.bench import daily
from eqrisk.bench.incremental import synthetic_market
from eqrisk.data import ingested
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingested import read_ingested
from eqrisk.snapshot.versions import Snapshot, current_version, snapshots_dir


def test_bench_daily_measures_the_daily_job_in_child_processes(tmp_path: Path) -> None:
    n, t = 40, 300
    work = tmp_path / "work"
    r = daily.measure(daily.DailyBench(symbols=n, sessions=t, dask_workers=1), work)

    # The data set: the synthetic market's priced cells of the first t NYSE sessions from 1996.
    panel, _ = synthetic_market(n, t + 1, 0)
    days = sessions_between(daily.FIRST_SESSION, "1998-01-01")
    assert r["data_set_rows"] == int((~np.isnan(panel.close[:, :t])).sum())
    assert r["last_session"] == str(days[t - 1].date())
    # The day's file: every symbol on the session after the last, its close the market's.
    day = pd.read_csv(work / daily.DAY_FILE)
    assert r["daily_new_session"] == str(days[t].date()) == day["date"].unique().item()
    assert sorted(day["symbol"]) == sorted(panel.symbols)
    expected = dict(zip(panel.symbols, panel.close[:, t], strict=True))
    assert np.allclose(day["adjusted_close"], day["symbol"].map(expected), rtol=1e-15, atol=0)

    # The merged data set has one more session, with the day's prices.
    prices, _, meta = read_ingested(work / "home")
    assert prices["date"].nunique() == t + 1 == meta["counts"]["sessions"]
    assert r["daily_data_set_sessions"] == t + 1
    last = prices[pd.to_datetime(prices["date"]) == days[t]].set_index("symbol")["close"]
    assert (
        last.sort_index().tolist()
        == day.set_index("symbol")["adjusted_close"].sort_index().tolist()
    )

    # The build was incremental and its version holds that session, with those prices.
    assert r["full_build_mode"] == "full" and r["daily_build_mode"] == "incremental"
    # (The Dask build on the same home published the version after it.)
    assert current_version(work / "home") != r["daily_version"]
    snap = Snapshot.open(snapshots_dir(work / "home") / r["daily_version"])
    assert len(snap.sessions) == t + 1 == r["daily_version_sessions"]
    assert str(snap.sessions[-1])[:10] == r["daily_new_session"] == r["daily_version_data_as_of"]
    close = np.asarray(snap.array("price_close"))[:, -1]
    rows = snap.row_of
    got = [close[rows[s]] for s in day["symbol"]]
    assert np.array_equal(got, day["adjusted_close"].to_numpy())

    # The figures are the child processes': an interpreter with numpy and pandas (> 50 MB),
    # below the machine's memory; the sampled anonymous peak within the kernel's resident peak.
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6
    for part in ("full_build", "daily_job", "dask_large_driver", "dask_small_driver"):
        rss, anon = r[f"{part}_peak_rss_mb"], r[f"{part}_peak_anon_mb"]
        assert isinstance(rss, float) and 50 < anon <= rss < total_mb, part
    # A stage's sampled VmRSS is within the job's kernel peak (ru_maxrss), up to the kernel's
    # approximate RSS counters (proc(5): VmRSS is inaccurate; the high-water mark is updated at
    # unmaps and exit): 324.1 against 324.0 was seen when the build stage held the job's peak.
    for part in ("merge", "build"):
        assert 50 < r[f"daily_{part}_peak_anon_mb"] <= r[f"daily_{part}_peak_rss_mb"]
        assert r[f"daily_{part}_peak_rss_mb"] <= r["daily_job_peak_rss_mb"] + 1.0, part
    # The alternative, the merge over the whole history, ends in the same data set.
    whole = ingested.read_ingested(work / "home-whole")
    pd.testing.assert_frame_equal(whole[0], prices)
    assert whole[2]["return_breaks"] == meta["return_breaks"]
    assert r["whole_merge_s"] > 0 and r["whole_merge_peak_rss_mb"] > 0
    stages = r["daily_merge_s"] + r["daily_build_s"] + r["daily_outside_stages_s"]
    assert abs(stages - r["daily_job_s"]) < 0.02 and r["daily_merge_s"] > 0
    # The workers' peaks were measured in the workers (each a process of its own).
    for size, symbols in (("large", n), ("small", n // 2)):
        assert r[f"dask_{size}_symbols"] == symbols and r[f"dask_{size}_mode"] == "full"
        assert 50 < r[f"dask_{size}_worker_peak_rss_mb"] < total_mb
    ratio = r["dask_large_driver_peak_rss_mb"] / r["dask_small_driver_peak_rss_mb"]
    assert r["dask_driver_peak_ratio"] == round(ratio, 3)
    # Each verdict is its figure's against the target.
    verdicts = {
        "daily_job_s_target": r["daily_job_s"] <= daily.DAILY_S,
        "daily_job_peak_rss_target": r["daily_job_peak_rss_mb"] < daily.DAILY_MB,
        "full_build_s_target": r["full_build_s"] <= daily.FULL_S,
        "full_build_peak_rss_target": r["full_build_peak_rss_mb"] <= daily.FULL_MB,
        "dask_driver_peak_ratio_target": ratio <= daily.DRIVER_RATIO,
    }
    for key, ok in verdicts.items():
        assert r[key].endswith(": pass" if ok else ": fail"), key
    assert r["full_build_vs_reference"].endswith(": not compared")
    # The CPU is the children's own (user + system), and the write floor wrote the version's
    # files again: as many, as large (the built version's files, counted here).
    assert r["full_build_cpu_s"] > 0 and r["daily_job_cpu_s"] > 0
    built = snapshots_dir(work / "home") / r["daily_version"]
    first = (
        snapshots_dir(work / "home")
        / sorted(
            v.name for v in snapshots_dir(work / "home").iterdir() if v.name.startswith("v1-")
        )[0]
    )
    files = [f for f in first.rglob("*") if f.is_file()]
    assert r["version_files"] == len(files) and built != first
    assert r["version_gb"] == round(sum(f.stat().st_size for f in files) / 1e9, 2)
    assert r["write_floor_s"] > 0 and not (work / "floor").exists()
    assert r["full_build_over_write_floor"] > 0
