"""Every `eqrisk bench <name>` runs at a tiny size as a user runs it (a child process, `--json`),
so that no bench rots between the runs that measure: one JSON document on stdout with the
figures the bench prints, each reference beside its figure. The shape of the output is checked,
never its timing (speed is read from the benches themselves, docs/BENCHMARKS.md).

The list of benches is read from the CLI: a new bench without a tiny run here fails
`test_every_bench_has_a_tiny_run`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eqrisk.cli.bench import bench_app
from helpers import eqrisk_cli


def _model(doc: dict[str, Any]) -> None:
    assert (doc["symbols"], doc["sessions"]) == (60, 700)
    assert doc["output_arrays"] == 17 and doc["floor_s"] > 0 and doc["kernel_wall_s"] > 0
    assert doc["kernel_over_floor"] > 0 and doc["speedup_vs_polars_market_beta"] > 0
    assert doc["rollingols_symbols_measured"] == 50
    assert doc["polars_same_publication"] is True and doc["rewrite_equals_first_run"] is True


def _risk(doc: dict[str, Any]) -> None:
    for n in (50, 300):
        assert doc[f"{n}_positions"] == n
        for way in ("eqrisk", "dense", "dense_given", "sample_cov"):
            assert doc[f"{n}_{way}_ms"] > 0
        assert doc[f"{n}_dense_over_eqrisk"] > 0 and doc[f"{n}_vol_rel_diff_dense"] < 1e-12


def _build(doc: dict[str, Any]) -> None:
    assert doc["symbols"] == 40 and doc["sessions"] == 300
    numbers = [v for v in doc.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    assert numbers and all(v >= 0 for v in numbers)
    assert doc["full_build_s"] > 0 and doc["incremental_build_s"] > 0
    assert doc["read_us_per_ticker_chunked"] > 0 and doc["read_us_per_ticker_monolithic_npy"] > 0
    assert doc["reads_identical"] is True and doc["zarr_reads_identical"] is True
    assert doc["incremental_equals_full"] is True and doc["dask_equals_local"] is True


def _daily(doc: dict[str, Any]) -> None:
    assert doc["symbols"] == 40 and doc["sessions"] == 300
    assert doc["data_set_rows"] > 0 and doc["last_session"] < doc["daily_new_session"]
    for figure in (
        "full_build_s",
        "daily_job_s",
        "daily_merge_s",
        "daily_build_s",
        "whole_merge_s",
    ):
        assert doc[figure] > 0, figure
    assert doc["daily_build_mode"] == "incremental"
    assert doc["daily_version_sessions"] == 301
    assert doc["whole_over_windowed_time"] > 0 and doc["whole_over_windowed_memory"] > 0
    for target in ("daily_job_s_target", "daily_job_peak_rss_target"):
        assert doc[target].endswith(("pass", "fail")), target


def _cost(doc: dict[str, Any]) -> None:
    routes = doc["routes"]
    assert routes and {"route", "case", "status", "usd", "cpu_ms", "cpu_s_per_usd"} <= set(
        routes[0]
    )
    assert all(r["cpu_ms"] >= 0 and r["usd"] >= 0 for r in routes)
    turns = [r for r in routes if "a new stock each call" in r["case"]]  # nothing cached
    assert len(turns) == 4 and all(r["status"] == "200" and r["usd"] > 0 for r in turns)
    assert doc["summary"] and doc["health_alone"] and doc["health_under_load"]


def _serve(doc: dict[str, Any]) -> None:
    rows = doc["results"]
    assert next(r["target"] for r in rows if r["cache"] == "off") == "health"
    assert all(r["rps"] > 0 and r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert all(r["rps_ratio_to_health"] > 0 for r in rows)
    assert doc["writers"] and all(w["json_identical"] for w in doc["writers"])
    metered = doc["metered"]
    assert metered["balance_latency"]["ledger_rows"] == 2_500
    assert metered["checks"]["usage_table_equals_ledger"] is True


def _wire(doc: dict[str, Any]) -> None:
    rows = doc["results"]
    assert len(rows) == 24  # 6 answers x identity, gzip, br, zstd
    # Its `/daily` request asks for symbols the served market holds (a fixed list once
    # answered 404 on the 16-year demo market).
    daily = [r for r in rows if r["target"].startswith("/daily")]
    assert [r["encoding"] for r in daily] == ["identity", "gzip", "br", "zstd"]
    assert daily[0]["bytes"] == daily[0]["identity_bytes"] > 0
    assert all(r["ratio"] == r["identity_bytes"] / r["bytes"] for r in rows)


def _pgbouncer(doc: dict[str, Any]) -> None:
    assert (doc["workers"], doc["pgbouncer_pool"], doc["connections"]) == (4, 20, 8)
    assert [p["phase"] for p in doc["phases"]] == ["pgbouncer", "direct"]
    for phase in doc["phases"]:
        assert phase["workers"] == 4 and phase["requests"] > 0, phase
        assert phase["failed_requests"] == 0 and phase["log_errors"] == 0, phase
        assert phase["charged_tokens_answered"] == phase["charged_tokens_ledger"] > 0, phase
        assert phase["credits_equal_ledger"] is True, phase
        assert 0 < phase["p50_ms"] <= phase["p99_ms"], phase
        assert phase["peak_server_connections"] > 0, phase
    assert doc["connection_errors"] == 0 and doc["credits_equal_ledger"] is True
    assert doc["postgres_connections_within_pool"] is True
    assert doc["p99_ratio_pgbouncer_to_direct"] > 0 and isinstance(doc["p99_within_2x"], bool)


def _imports(doc: dict[str, Any]) -> None:
    assert doc["repeats"] == 1
    for key in ("help", "update_help", "update", "whole_package"):
        assert doc[f"{key}_import_ms"] > 0 and doc[f"{key}_wall_s"] > 0, key
        assert doc[f"{key}_import_ms_runs"] == [doc[f"{key}_import_ms"]], key
        assert doc[f"{key}_largest_packages"], key
    # The command's start loads a part of what the daily job loads, which loads a part of
    # the package and its libraries.
    modules = [doc[f"{k}_modules"] for k in ("help", "update_help", "update", "whole_package")]
    assert modules == sorted(modules) and len(set(modules)) == 4
    assert "numba" in doc["update_largest_packages"] or "pandas" in doc["update_largest_packages"]
    for key in ("help_target", "update_help_target"):
        assert doc[key].endswith(("pass", "fail")), key


# name: (arguments at a tiny size, the check of its JSON). `{home}` is a copy of the demo home.
TINY: dict[str, tuple[list[str], Callable[[dict[str, Any]], None]]] = {
    "model": (["--quick"], _model),
    "risk": (["--quick", "--repeats", "1"], _risk),
    "build": (
        [
            "--quick",
            "--symbols",
            "40",
            "--sessions",
            "300",
            "--reads",
            "5",
            "--chunk",
            "64",
            "--block",
            "16",
            "--zarr-fields",
            "1",
        ],
        _build,
    ),
    "daily": (
        # The Dask builds are run by tests/bench/test_bench_daily.py.
        ["--quick", "--symbols", "40", "--sessions", "300", "--no-dask"],
        _daily,
    ),
    "cost": (["--repeats", "1", "--seconds", "0.3"], _cost),
    "imports": (["--repeats", "1", "--symbols", "20", "--sessions", "200"], _imports),
    "serve": (
        ["--quick", "--seconds", "0.3", "--connections", "2", "--generator", "httpx"],
        _serve,
    ),
    "wire": (["--home", "{home}", "--repeats", "1"], _wire),
    # PostgreSQL at 127.0.0.1:5432 (a database of its own) and Debian's pgbouncer.
    "pgbouncer": (["--workers", "4", "--quick"], _pgbouncer),
}


# Benches without a tiny run yet, each with the reason and what runs its parts meanwhile.
NOT_YET = {
    "cache": "needs a built store of two versions and moto's S3 server: its parts run in "
    "tests/snapshot/test_bucket.py",
}


def test_every_bench_has_a_tiny_run() -> None:
    benches = sorted(str(c.name) for c in bench_app.registered_commands)
    assert sorted([*TINY, *NOT_YET]) == benches
    assert not set(TINY) & set(NOT_YET)


@pytest.mark.parametrize("name", sorted(TINY))
def test_eqrisk_bench_runs_at_a_tiny_size(name: str, tmp_path: Path, request: Any) -> None:
    args, check = TINY[name]
    if any("{home}" in a for a in args):
        demo_home: Path = request.getfixturevalue("demo_home")
        shutil.copytree(demo_home / "snapshots", tmp_path / "home" / "snapshots")
        args = [a.format(home=tmp_path / "home") for a in args]
    proc = eqrisk_cli(
        tmp_path / "unused", "bench", name, *args, "--json", inherit=True, timeout=900, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(json.loads(proc.stdout))
