"""The command line as a user runs it: real processes, stdout for results, stderr for progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eqrisk.data.panel import read_ingested


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EQRISK_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def demo_cli_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    home = tmp_path_factory.mktemp("cli-home")
    proc = run(home, "demo", "--no-serve", "--json")
    assert proc.returncode == 0, proc.stderr
    return home, json.loads(proc.stdout)


def test_demo_builds_a_snapshot_and_prints_one_json_document(demo_cli_home) -> None:
    home, summary = demo_cli_home
    assert summary["data_source"] == "demo-synthetic"
    assert summary["universe_size"] >= 180
    assert summary["method"]["window"] == 252
    listing = run(home, "snapshots", "--json")
    assert listing.returncode == 0
    doc = json.loads(listing.stdout)
    assert doc["current"] == summary["model_version"]
    assert [v["current"] for v in doc["versions"]] == [True]


def test_build_adds_a_version_with_the_requested_method(demo_cli_home) -> None:
    home, first = demo_cli_home
    proc = run(home, "build", "--halflife", "90", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["method"]["weighting"] == "ewma" and summary["method"]["halflife"] == 90
    assert summary["model_version"] != first["model_version"]


def test_config_masks_secrets(tmp_path: Path) -> None:
    env_home = tmp_path / "h"
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "config", "--json"],
        env={**os.environ, "EQRISK_HOME": str(env_home), "EQRISK_REDIS_URL": "redis://:pw@x:1/0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["home"] == str(env_home)
    assert doc["redis_url"] == "**********"
    assert "pw" not in proc.stdout


def test_bad_input_gives_a_report_a_nonzero_exit_and_keeps_good_rows(tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "date,symbol,close\n"
        "2024-07-01,AAA,10\n2024-07-02,AAA,10.5\n2024-07-03,AAA,abc\n"
        "2024-07-04,AAA,11\n2024-07-05,AAA,-3\n2024-07-08,AAA,11.2\n"
    )
    master = tmp_path / "master.csv"
    master.write_text(
        "symbol,name,asset_type,gics_sector,gics_sub_industry\nAAA,Aaa Inc,stock,Energy,Steel\n"
    )
    home = tmp_path / "home"
    proc = run(home, "ingest", str(prices), "--master", str(master), "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["rows_read"] == 6 and report["rows_kept"] == 3 and report["rows_rejected"] == 3
    codes = {i["code"]: i["count"] for i in report["issues"]}
    assert codes["NON_NUMERIC_PRICE"] == 1 and codes["NON_POSITIVE_PRICE"] == 1
    assert codes["NOT_A_SESSION"] == 1  # 2024-07-04 is a holiday
    assert (Path(report["report_dir"]) / "rejected.csv").read_text().count("\n") == 4
    kept, _, _ = read_ingested(home)
    assert sorted(kept["close"]) == [10.0, 10.5, 11.2]


def test_usage_errors_exit_2_and_say_what_is_wrong(tmp_path: Path) -> None:
    proc = run(tmp_path, "ingest", str(tmp_path / "missing.csv"))
    assert proc.returncode == 2
    assert "no such file" in proc.stderr
    proc = run(tmp_path, "serve", "--service", "both")
    assert proc.returncode == 2
    assert "all, daily" in proc.stderr


def test_build_without_data_says_how_to_get_some(tmp_path: Path) -> None:
    proc = run(tmp_path, "build")
    assert proc.returncode == 1
    assert "eqrisk ingest" in proc.stderr


def test_update_merges_and_builds_incrementally_and_build_full_rebuilds(
    demo_cli_home, tmp_path: Path
) -> None:
    """`eqrisk update FILE` = ingest --merge + build: the last day's rows again change no
    history, so the build reuses every full chunk; `build --full` says it was forced."""
    import pandas as pd

    home, _ = demo_cli_home
    assert run(home, "build", "--json").returncode == 0  # default settings as the baseline
    prices = pd.read_csv(home / "demo" / "demo_prices.csv.gz")
    day = prices[prices["date"] == prices["date"].max()]
    path = tmp_path / "day.csv"
    day.to_csv(path, index=False)
    proc = run(home, "update", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    build = json.loads(proc.stdout)["build"]
    assert build["mode"] == "incremental"
    assert build["reasons"][0].startswith("the last chunk recomputed from")
    full = run(home, "build", "--full", "--json")
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["build"] == {"mode": "full", "reasons": ["--full"]}
