"""`eqrisk config --check` against the real PostgreSQL, Redis and a real Dask scheduler of this
machine, a real snapshot store, and closed ports: one line per check, exit 3 on a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.accounts.db import make_engine
from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.calendar import sessions_between
from eqrisk.data.ingest import ingest
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.versions import current_version
from helpers import REDIS_URL, free_port

ENV_PROBLEM = 3


def _check(home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "eqrisk.cli",
            "config",
            "--check",
            *(["--json"] if env.pop("JSON", "") else []),
        ],
        env={**clean, "EQRISK_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=home,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with one small snapshot built (4 symbols, 200 sessions)."""
    folder = tmp_path_factory.mktemp("check-home")
    sessions = sessions_between(pd.Timestamp("2023-01-03"), pd.Timestamp("2023-10-20"))
    symbols = ["SPY", "XLK", "AAA", "BBB"]
    steps = np.random.default_rng(3).normal(0, 0.01, (len(sessions), len(symbols)))
    close = pd.DataFrame(100 * np.exp(np.cumsum(steps, axis=0)), index=sessions, columns=symbols)
    close.index.name = "date"
    close.to_csv(folder / "wide.csv")
    pd.DataFrame(
        {
            "symbol": symbols[2:],
            "name": symbols[2:],
            "asset_type": "stock",
            "gics_sector": "Information Technology",
            "gics_sub_industry": "Application Software",
        }
    ).to_csv(folder / "master.csv", index=False)
    assert ingest([folder / "wide.csv"], folder / "master.csv", home=folder / "home").ok
    build_snapshot(folder / "home", ModelParams(window=60, min_obs=30))
    return folder / "home"


def test_every_check_passes_on_the_real_backends(home: Path, pg_database_url: str) -> None:
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        protocol="tcp://",
        dashboard_address=":0",
    ) as cluster:
        proc = _check(
            home,
            EQRISK_DATABASE_URL=pg_database_url,
            EQRISK_REDIS_URL=REDIS_URL,
            EQRISK_DASK=cluster.scheduler_address,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "database"],
        ["ok", "redis"],
        ["ok", "snapshots"],
        ["ok", "dask"],
    ]
    assert "PostgreSQL" in lines[0] and "connected" in lines[0]
    assert "PING answered" in lines[1]
    assert f"current version {current_version(home)} opens" in lines[2]
    assert "1 versions kept" in lines[2]
    assert "1 workers, 2 threads" in lines[3]
    assert proc.stderr == ""


def test_sqlite_default_and_closed_ports_fail_with_the_reason(home: Path) -> None:
    port = free_port()  # nothing listens there
    proc = _check(
        home,
        JSON="1",
        EQRISK_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/test",
        EQRISK_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        EQRISK_DASK=f"tcp://127.0.0.1:{port}",
    )
    assert proc.returncode == ENV_PROBLEM
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert {n: c["ok"] for n, c in checks.items()} == {
        "database": False,
        "redis": False,
        "snapshots": True,
        "dask": False,
    }
    assert "Connection refused" in checks["database"]["detail"]
    assert "refused" in checks["redis"]["detail"].lower()
    assert f"127.0.0.1:{port}" in checks["dask"]["detail"]
    assert proc.stderr.strip() == "error: 3 of 4 checks failed: database, redis, dask"

    sqlite = _check(home)  # no database URL: the home's SQLite file
    assert sqlite.returncode == 0, sqlite.stdout
    assert sqlite.stdout.startswith("ok   database  SQLite ")
    make_engine(home).dispose()  # the file made, as the first command that needs it does
    made = _check(home).stdout.splitlines()[0]
    assert (
        made == f"ok   database  SQLite {home / 'accounts.db'}: connected, accounts schema present"
    )


def test_a_missing_or_broken_store_fails(home: Path, tmp_path: Path) -> None:
    empty = _check(tmp_path)
    assert empty.returncode == ENV_PROBLEM
    assert "FAIL snapshots" in empty.stdout and "is not a readable folder" in empty.stdout
    (tmp_path / "snapshots").mkdir()
    (tmp_path / "snapshots" / "CURRENT").write_text("v9-20240101T000000Z\n")
    broken = _check(tmp_path)
    assert broken.returncode == ENV_PROBLEM
    assert "FAIL snapshots" in broken.stdout and "v9-20240101T000000Z" in broken.stdout
