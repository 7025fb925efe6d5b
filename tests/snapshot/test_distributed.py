"""Issue 10, Dask builds: the model run in blocks of symbols (in process, on a Dask cluster, and
through `eqrisk build --dask local`) gives the local build's numbers bit for bit, and a block
carries its own rows only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from eqrisk.build.distributed import run_model_dask
from eqrisk.data.ingested import ingested_dir, read_ingested
from eqrisk.data.master import Mappings, classify
from eqrisk.data.panel import Panel, to_panel
from eqrisk.model.run import (
    ModelParams,
    ModelResult,
    finish_model,
    plan_model,
    run_block,
    run_model,
)
from eqrisk.snapshot.risk_arrays import RISK_FIELDS, factor_covariance_of
from eqrisk.snapshot.versions import Snapshot, current_version, snapshots_dir
from helpers import nan_equal, without_progress

PARAMS = ModelParams(window=120, min_obs=60)


@pytest.fixture(scope="module")
def stocks_only(demo_home: Path) -> tuple[Panel, pd.DataFrame]:
    """The demo's stocks without any ETF: every level is a group portfolio, and every stock is
    regressed on leave-one-out rows (the rows a block must carry along)."""
    prices, raw, _meta = read_ingested(demo_home)
    stocks = set(raw.loc[raw["asset_type"] == "stock", "symbol"].astype(str))
    prices = prices[prices["symbol"].isin(stocks)]
    raw = raw[raw["symbol"].isin(stocks)]
    return to_panel(prices, raw), classify(raw, Mappings.load())


@pytest.fixture(scope="module")
def whole(stocks_only: tuple[Panel, pd.DataFrame]) -> ModelResult:
    panel, master = stocks_only
    return run_model(panel, master, PARAMS)


def assert_same_result(a: ModelResult, b: ModelResult) -> None:
    """Every metric array equal bit for bit (NaN where NaN), same names in the same order."""
    assert list(a.metrics) == list(b.metrics)
    for name in a.metrics:
        assert a.metrics[name].dtype == b.metrics[name].dtype, name
        assert nan_equal(a.metrics[name], b.metrics[name]), name
    assert nan_equal(a.flat.returns, b.flat.returns)
    assert nan_equal(a.flat.sector_market_beta, b.flat.sector_market_beta)
    assert np.array_equal(a.flat.exposure, b.flat.exposure)
    assert a.flat.names == b.flat.names and a.factor_keys == b.factor_keys
    assert a.notes == b.notes
    assert a.hierarchy.equals(b.hierarchy)


def test_blocks_give_the_whole_run_bit_for_bit(
    stocks_only: tuple[Panel, pd.DataFrame], whole: ModelResult
) -> None:
    panel, master = stocks_only
    assert whole.notes["leave_one_out_rows"] > panel.shape[0]  # sector and subsector groups
    blocks = run_model(panel, master, PARAMS, block_rows=37)  # 192 rows: 5 of 37, then 7
    assert_same_result(whole, blocks)
    assert np.isfinite(blocks.metrics["l3_sub_hr"]).sum() > 0
    # Blocks that carry their own leave-one-out rows, as a Dask worker gets them.
    plan = plan_model(panel, master, PARAMS)
    parts = [(a, run_block(plan.shared, plan.block(a, b))) for a, b in plan.blocks(37)]
    assert_same_result(whole, finish_model(plan, parts[::-1]))  # any order


def test_a_block_carries_its_own_rows_only(stocks_only: tuple[Panel, pd.DataFrame]) -> None:
    panel, master = stocks_only
    plan = plan_model(panel, master, PARAMS)
    published = plan.shared.factors.shape[0]
    layout = plan.layout
    assert plan.blocks(37)[-1] == (185, 192) and len(plan.blocks(37)) == 6
    for start, stop in plan.blocks(37):
        block = plan.block(start, stop)
        assert np.array_equal(block.returns, plan.returns[start:stop], equal_nan=True)
        referenced = layout.model_fidx[start:stop]
        n_own = len(np.unique(referenced[referenced >= published]))
        # Its leave-one-out rows: the ones its stocks use, at most one per stock and level.
        assert block.own_factors.shape[0] == n_own <= 3 * (stop - start)
        rows = np.vstack([plan.shared.factors, block.own_factors])
        for i in range(stop - start):
            for level in range(3):
                j, k = block.model_fidx[i, level], layout.model_fidx[start + i, level]
                assert (j < 0) == (k < 0)
                if k >= 0:
                    assert nan_equal(rows[j], layout.model_factors[k])


def test_a_dask_cluster_gives_the_local_result(
    stocks_only: tuple[Panel, pd.DataFrame], whole: ModelResult
) -> None:
    """A scheduler address (the `tcp://` path) of a cluster with one worker of two threads:
    the blocks also race inside one worker process."""
    from distributed import Client, LocalCluster

    panel, master = stocks_only
    said: list[str] = []
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster.scheduler_address) as client,
    ):
        result = run_model_dask(panel, master, PARAMS, client, block_rows=50, progress=said.append)
    assert_same_result(whole, result)
    done = [line for line in said if line.startswith("blocks ") and line.endswith(" done")]
    assert done == [f"blocks {k}/4 done" for k in range(1, 5)]  # 192 rows in blocks of 50


def test_build_dask_local_publishes_the_local_build(demo_home: Path, tmp_path: Path) -> None:
    """`eqrisk build --dask local` with two worker processes on the demo's ingested data: the
    version it publishes holds the same arrays and tables as the local build's."""
    home = tmp_path / "home"
    shutil.copytree(ingested_dir(demo_home), ingested_dir(home))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    args = ["build", "--json", "--dask", "local", "--dask-workers", "2", "--block-rows", "60"]
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", *args],
        env={**env, "EQRISK_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    version = json.loads(proc.stdout)["model_version"]
    assert current_version(home) == version
    local = Snapshot.open(snapshots_dir(demo_home) / str(current_version(demo_home)))
    dask = Snapshot.open(snapshots_dir(home) / version)
    assert dask.manifest["fields"] == local.manifest["fields"]
    assert dask.manifest["model"] == local.manifest["model"]
    for name in local.manifest["fields"]:
        assert nan_equal(np.asarray(dask.array(name)), np.asarray(local.array(name))), name
    assert nan_equal(np.asarray(dask.factor_returns), np.asarray(local.factor_returns))
    # The risk model: every stored field and F of every session, bit for bit.
    assert dask.manifest["risk"] == local.manifest["risk"]
    for name in RISK_FIELDS:
        assert np.asarray(dask.array(name)).tobytes() == np.asarray(local.array(name)).tobytes()
    for t in range(0, len(local.sessions), 50):
        f_dask = factor_covariance_of(dask.path, dask.manifest, t).cov
        assert f_dask.tobytes() == factor_covariance_of(local.path, local.manifest, t).cov.tobytes()
    # Every risk file (the second layer's exposures and regression, the regime, the states,
    # the next session's forecast) holds the same bits.
    names = sorted(p.name for p in (local.path / "risk").iterdir())
    assert sorted(p.name for p in (dask.path / "risk").iterdir()) == names
    assert local.manifest["risk"]["styles"] and "next-sexp.npy" in names
    for name in names:
        if name.endswith(".npz"):
            with np.load(dask.path / "risk" / name) as x, np.load(local.path / "risk" / name) as y:
                assert all(x[k].tobytes() == y[k].tobytes() for k in y.files), name
        else:
            got = (dask.path / "risk" / name).read_bytes()
            assert got == (local.path / "risk" / name).read_bytes(), name
    for table in ("symbols.parquet", "security_history"):  # a file, a dataset of files
        assert pq.read_table(dask.path / table).equals(pq.read_table(local.path / table)), table


def test_an_unreachable_scheduler_is_one_line_and_changes_nothing(
    demo_home: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    shutil.copytree(ingested_dir(demo_home), ingested_dir(home))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQRISK_")}
    proc = subprocess.run(
        [sys.executable, "-m", "eqrisk.cli", "build", "--dask", "tcp://127.0.0.1:9"],
        # Dask's own setting: how long a client tries to reach the scheduler (30 s by default).
        env={**env, "EQRISK_HOME": str(home), "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    lines = without_progress(proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("error: no Dask scheduler at tcp://127.0.0.1:9")
    assert current_version(home) is None and not list(snapshots_dir(home).glob("v*"))
