"""`eqrisk bench build` runs end to end on a small universe and its figures agree with each
other (no timing is asserted: speed is read from the bench, not from tests)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from eqrisk.bench import build
from eqrisk.snapshot import chunks


def test_bench_build_figures_are_consistent(tmp_path: Path) -> None:
    # 40 symbols in blocks of 16 (3 blocks), 300 sessions in chunks of 32 (the last holds 12).
    bench = build.BuildBench(
        symbols=40,
        sessions=300,
        reads=10,
        chunk=32,
        block=16,
        zarr_fields=0,
        folder=tmp_path,
        model_check=True,
    )
    result = build.run(bench)
    assert not list(tmp_path.iterdir())  # the bench cleans up after itself
    assert result["reads_identical"] is True
    assert result["fields"] == 41 and result["fields_derived"] == sorted(build.DERIVED)
    assert result["fields_stored"] == 41 - len(build.DERIVED)
    assert result["update_chunks_written"] == result["update_chunks_expected"] > 2
    # Everything but the last chunk (and this year's monthly file) is shared.
    assert result["update_chunks_shared"] > 3 * result["update_chunks_written"]
    added, full = result["update_added_bytes"], result["full_version_bytes"]
    assert 0 < added < full / 5
    assert result["update_added_pct"] == round(100 * added / full, 3)
    assert result["full_version_mb"] >= result["arrays_mb"] + result["security_history_mb"]
    assert result["update_worst_case_pct"] == pytest.approx(100 * 32 / 301, abs=1e-3)
    assert (
        result["read_us_per_ticker_chunked"] > 0 and result["read_ratio_chunked_vs_monolithic"] > 0
    )
    # The model section: the one-session build is incremental from the last 128-session chunk
    # (300 sessions: chunks 0, 1 reused), equal to a full rebuild, and adds less than a version.
    assert result["incremental_mode"] == "incremental"
    assert result["incremental_from_chunk"] == 2
    assert result["incremental_equals_full"] is True
    assert 0 < result["incremental_added_mb"] < result["model_version_mb"]
    assert result["full_build_s"] > 0 and result["incremental_build_s"] > 0
    # The accuracy record's steps, timed inside each build: part of it, never all of it.
    for build_kind in ("full_build", "incremental_build"):
        assert 0 < result[f"{build_kind}_accuracy_s"] < result[f"{build_kind}_s"]
        assert 0 < result[f"{build_kind}_accuracy_share"] < 1
    # The same full build on a Dask LocalCluster: the very same version.
    assert result["dask_equals_local"] is True
    assert result["dask_workers"] == (os.cpu_count() or 1) and result["dask_full_build_s"] > 0
    # Peak resident memory of each build (Linux, VmHWM reset before each): this process, so
    # at least its interpreter and libraries, at most the machine's memory.
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    for key in (
        "full_build_peak_rss_mb",
        "incremental_build_peak_rss_mb",
        "dask_driver_peak_rss_mb",
        "dask_worker_peak_rss_mb",
        "full_build_peak_anon_mb",
        "incremental_build_peak_anon_mb",
        "dask_driver_peak_anon_mb",
    ):
        assert isinstance(result[key], float) and 50 < result[key] < total_mb, key
    for part in ("full_build", "incremental_build", "dask_driver"):  # anonymous <= resident
        assert result[f"{part}_peak_anon_mb"] <= result[f"{part}_peak_rss_mb"], part


def test_synthetic_fields_do_not_change_when_a_session_is_added() -> None:
    short = build.synthetic_fields(30, 100, seed=4, horizon=100)
    longer = build.synthetic_fields(30, 101, seed=4, horizon=100)
    for name in short:
        a = np.asarray(short[name][0:30, 0:100])
        b = np.asarray(longer[name][0:30, 0:101])
        assert a.tobytes() == np.ascontiguousarray(b[:, :100]).tobytes(), name
    counts = np.asarray(short["n_obs"][0:30, 0:100])
    assert counts.max() <= 252 and (counts == np.round(counts)).all()
    rr = chunks.derive("minus", [short["return"][0:30, 0:100], short["l1_cfr"][0:30, 0:100]])
    assert np.asarray(short["l1_rr"][0:30, 0:100]).tobytes() == rr.tobytes()


def test_bench_build_reads_zarr_on_the_same_grid(tmp_path: Path) -> None:
    import zarr  # noqa: F401  (the test extra installs it: the comparison must run in CI)

    bench = build.BuildBench(
        symbols=20, sessions=100, reads=5, chunk=32, block=16, zarr_fields=2, folder=tmp_path
    )
    result = build.run(bench)
    assert result["zarr_fields"] == 2 and result["zarr_reads_identical"] is True
    assert 0 < result["zarr_zstd_bytes"] < result["zarr_raw_bytes"]
    assert result["read_us_per_field_zarr_zstd"] > 0 and result["read_us_per_field_zarr_raw"] > 0
