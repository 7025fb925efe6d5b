"""The long table's daily rows are a view of the arrays (issue 10, full store): a version of
the real data set answers `security_history(**filters)` with the very DataFrame the stored
Parquet files gave (written here from the model's in-memory arrays, as builds wrote them
before), and `eqrisk export security-history` writes those files byte for byte."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from eqrisk.data.panel import Panel
from eqrisk.model.run import ModelParams, run_model
from eqrisk.snapshot import chunks, tables
from eqrisk.snapshot.versions import (
    Snapshot,
    SnapshotStore,
    current_version,
    snapshots_dir,
    write_snapshot,
)


@pytest.fixture(scope="module")
def real_version(
    real_universe: tuple[Panel, pd.DataFrame], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A version of the real data set, and the long table as a build stored it before: the
    Parquet files written from the model's arrays in memory (not from the version)."""
    panel, master = real_universe
    result = run_model(panel, master, ModelParams())
    home = tmp_path_factory.mktemp("history-home")
    content = tables.SnapshotContent(
        result=result, panel=panel, master=master, data_source="real", ingest={}
    )
    manifest = write_snapshot(home, content)
    fields: dict[str, Any] = dict(result.metrics)
    for name in tables.PANEL_ARRAYS:
        fields[name] = getattr(panel, name)
    stored = tmp_path_factory.mktemp("stored-history")
    files = tables.write_security_history(
        stored,
        fields,
        result.symbols.tolist(),
        panel.sessions,
        chunks.ChunkGrid(len(result.symbols), len(panel.sessions)),
        daily=True,
    )
    snap = Snapshot.open(snapshots_dir(home) / manifest["model_version"])
    return {"home": home, "snap": snap, "stored": stored, "files": files}


def _stored(real_version: dict[str, Any], **filters: Any) -> pd.DataFrame:
    expr = [(k, "=", v) for k, v in filters.items()]
    files = [str(real_version["stored"] / f) for f in real_version["files"]]
    return pq.ParquetDataset(files, filters=expr or None).read().to_pandas()


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"symbol": "MSFT"},
        {"symbol": "XLK"},
        {"symbol": "NVDA", "metric_key": "L3_subsector_HR"},
        {"metric_key": "L3_residual_risk", "periodicity": "daily"},
        {"periodicity": "monthly"},
        {"teo": dt.date(2020, 3, 16)},
        {"symbol": "NO_SUCH_TICKER"},
    ],
)
def test_the_daily_view_is_the_stored_tables_dataframe(
    real_version: dict[str, Any], filters: dict[str, Any]
) -> None:
    snap: Snapshot = real_version["snap"]
    assert not snap.stores_daily_history
    got = snap.security_history(**filters)
    want = _stored(real_version, **filters)
    if filters.get("symbol") != "NO_SUCH_TICKER":
        assert len(want) > 0
    assert list(got.dtypes) == list(want.dtypes) and list(got.columns) == list(want.columns)
    assert got.equals(want)  # every row in the same order, the same values and categories


def test_a_version_stores_the_monthly_rows_only(real_version: dict[str, Any]) -> None:
    snap: Snapshot = real_version["snap"]
    listed = snap.manifest["security_history"]
    assert listed and all(Path(f).name.startswith("monthly-") for f in listed)
    assert sorted(p.name for p in (snap.path / "security_history").iterdir()) == sorted(
        Path(f).name for f in listed
    )
    daily = sum((real_version["stored"] / f).stat().st_size for f in real_version["files"])
    kept = sum((snap.path / f).stat().st_size for f in listed)
    assert kept < 0.1 * daily  # the daily rows were 95% of the long table's bytes


def test_the_export_writes_the_stored_files_byte_for_byte(
    real_version: dict[str, Any], tmp_path: Path
) -> None:
    snap: Snapshot = real_version["snap"]
    written = snap.export_security_history(tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(Path(f).name for f in real_version["files"])
    for rel in real_version["files"]:
        assert (tmp_path / "out" / Path(rel).name).read_bytes() == (
            real_version["stored"] / rel
        ).read_bytes()


def test_eqrisk_export_security_history(demo_home: Path, tmp_path: Path) -> None:
    """The command on the demo home: the dataset it writes reads as the version's long table."""
    out = tmp_path / "dataset"
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "export", "security-history", "--out", str(out)],
        env={**os.environ, "EQRISK_HOME": str(demo_home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    snap = SnapshotStore(demo_home).current()
    exported = pq.ParquetDataset(sorted(str(p) for p in out.iterdir())).read().to_pandas()
    assert exported.equals(snap.security_history())
    names = sorted(p.name for p in out.iterdir())
    grid = chunks.ChunkGrid.of(snap.manifest["arrays"]["grid"])
    assert [n for n in names if n.startswith("daily-")] == [
        f"daily-{c:05d}.parquet" for c in range(grid.chunks)
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "export", "security-history", "--out", str(out),
         "--version", "v99", "--json"],
        env={**os.environ, "EQRISK_HOME": str(demo_home)},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and "v99" in proc.stderr
    assert current_version(demo_home) == snap.version  # nothing changed in the home
