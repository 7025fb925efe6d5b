"""Issue 10, Dask builds that write: each worker writes the chunk files of its own symbol
blocks into the new version; the builder gets back codes and per-row values only. The version
equals a local build's bit for bit, over several blocks of the chunk grid, with market caps
(the universe-wide cap rank) and with a field one block cannot derive."""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from eqrisk.bench.incremental import _cut, synthetic_market
from eqrisk.build import distributed
from eqrisk.build.block_inputs import InMemory
from eqrisk.build.pipeline import publish_panel
from eqrisk.data.panel import Panel
from eqrisk.model import run as model_run
from eqrisk.model.run import ModelParams, plan_model
from eqrisk.snapshot import chunks
from eqrisk.snapshot.versions import Snapshot, snapshots_dir
from helpers import nan_equal

PARAMS = ModelParams(window=60, min_obs=30)
N, T = 2 * chunks.BLOCK_SYMBOLS + 40, 260  # three blocks of the grid (the last of 40 rows)


@pytest.fixture(scope="module")
def next_day() -> tuple[Panel, pd.DataFrame]:
    """The synthetic market over T + 1 sessions, with market caps (shares x close) for most
    stocks."""
    panel, master = synthetic_market(N, T + 1, seed=3)
    shares = np.random.default_rng(5).uniform(1e6, 1e9, N)
    shares[np.random.default_rng(6).random(N) < 0.1] = np.nan  # some stocks without a cap
    shares[:12] = np.nan  # the ETFs
    return replace(panel, market_cap=panel.close * shares[:, None]), master


@pytest.fixture(scope="module")
def market(next_day: tuple[Panel, pd.DataFrame]) -> tuple[Panel, pd.DataFrame]:
    """The market of T sessions (the day before `next_day`)."""
    panel, master = next_day
    return _cut(panel, T), master


@pytest.fixture(scope="module")
def cluster_address() -> Iterator[str]:
    """Two worker processes, as on two hosts (nothing shared but the store's path)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield str(cluster.scheduler_address)


def assert_same_version(a: Snapshot, b: Snapshot) -> None:
    """Every array and table equal bit for bit, the same chunk codes, derivations and input
    digests."""
    assert a.manifest["fields"] == b.manifest["fields"]
    assert a.manifest["arrays"] == b.manifest["arrays"]
    assert a.manifest["model"] == b.manifest["model"]
    assert a.manifest["inputs"] == b.manifest["inputs"]
    for name in a.manifest["fields"]:
        x, y = np.asarray(a.array(name)), np.asarray(b.array(name))
        assert x.tobytes() == y.tobytes(), name
    assert nan_equal(np.asarray(a.factor_returns), np.asarray(b.factor_returns))
    for table in ("symbols.parquet", "security_history"):
        assert pq.read_table(a.path / table).equals(pq.read_table(b.path / table)), table


def test_workers_write_the_local_build(
    market: tuple[Panel, pd.DataFrame], cluster_address: str, tmp_path: Path
) -> None:
    panel, master = market
    local_home, dask_home = tmp_path / "local", tmp_path / "dask"
    local = publish_panel(local_home, panel, master, PARAMS, full=True)
    said: list[str] = []
    built = publish_panel(
        dask_home, panel, master, PARAMS, dask=cluster_address, block_rows=1, progress=said.append
    )
    assert built["build"] == {"mode": "full", "reasons": ["a Dask build"]}
    a = Snapshot.open(snapshots_dir(local_home) / local["model_version"])
    b = Snapshot.open(snapshots_dir(dask_home) / built["model_version"])
    assert_same_version(a, b)
    ranks = np.asarray(b.array("mktcap_rank"))
    assert np.nanmax(ranks) > chunks.BLOCK_SYMBOLS  # ranked across the blocks, not within one
    assert np.isfinite(np.asarray(b.array("l2_sec_hr"))).sum() > N * (T - PARAMS.window)
    assert b.manifest["storage"]["derived"] == sorted(chunks.DERIVATIONS)
    assert [line for line in said if line.endswith(" written")] == [
        f"blocks {k}/3 written" for k in range(1, 4)
    ]
    # No staging folder left in the store; the version is complete and readable.
    assert [p.name for p in snapshots_dir(dask_home).iterdir() if p.name.startswith(".st")] == []
    # A Dask build over the local build's version shares every chunk with it (hard links).
    again = publish_panel(local_home, panel, master, PARAMS, dask=cluster_address)
    assert again["storage"]["chunks_written"] == 0
    c = Snapshot.open(snapshots_dir(local_home) / again["model_version"])
    assert_same_version(a, c)
    probe = chunks.group_path(1, 0)
    assert (a.path / probe).stat().st_ino == (c.path / probe).stat().st_ino


def test_a_dask_version_is_the_base_of_an_incremental_build(
    market: tuple[Panel, pd.DataFrame],
    next_day: tuple[Panel, pd.DataFrame],
    cluster_address: str,
    tmp_path: Path,
) -> None:
    """The next session, built locally over a Dask-written version, is incremental and equals
    a full build of the same data."""
    (panel, master), (longer, _) = market, next_day
    home = tmp_path / "home"
    publish_panel(home, panel, master, PARAMS, dask=cluster_address)
    incremental = publish_panel(home, longer, master, PARAMS)
    assert incremental["build"]["mode"] == "incremental"
    assert incremental["build"]["from_chunk"] == T // chunks.CHUNK_SESSIONS
    full = publish_panel(tmp_path / "full", longer, master, PARAMS, full=True)
    assert_same_version(
        Snapshot.open(snapshots_dir(home) / incremental["model_version"]),
        Snapshot.open(snapshots_dir(tmp_path / "full") / full["model_version"]),
    )


def test_the_builder_never_holds_an_output_array(
    market: tuple[Panel, pd.DataFrame], cluster_address: str, tmp_path: Path
) -> None:
    """What comes back from a worker is per row (latest values, two indexes) and code strings;
    the builder's own allocations while the blocks run stay far below what the blocks compute
    (the market without caps: with caps, the universe-wide cap rank is one (n x T) array)."""
    from distributed import Client

    panel, master = market
    panel = replace(panel, market_cap=np.full_like(panel.close, np.nan))
    plan = plan_model(panel, master, PARAMS)
    one_field = N * T * 8
    with Client(cluster_address) as client:
        client.run(lambda: None)  # connected before measuring
        tracemalloc.start()
        try:
            staged, names = distributed.write_model_dask(
                InMemory(plan), client, tmp_path / "staging", block_rows=1
            )
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # What it allocates is the inputs of the blocks on their way (a block's returns and
    # prices), less than two fields of the universe and a tenth of one block's outputs.
    block_outputs = chunks.BLOCK_SYMBOLS * T * 8 * len(names)
    assert peak < min(2 * one_field, block_outputs / 10), (peak, one_field, block_outputs)
    assert set(staged.latest) == set(names) and len(names) > 30
    assert staged.last.shape == (N,) and (staged.last == T - 1).all()
    # Each field's latest values are the written chunks' values at each row's last session.
    written = chunks.open_arrays(tmp_path / "staging", staged.arrays)
    rows = np.arange(N)
    for name in ("l2_sec_hr", "vol_252d_ann", "price_close", "beta_mkt"):
        got = np.asarray([written[name][int(r), int(staged.last[r])] for r in rows])
        assert nan_equal(got, staged.latest[name]), name


def test_what_a_task_returns_is_per_row(market: tuple[Panel, pd.DataFrame], tmp_path: Path) -> None:
    """One task, run here as a worker runs it: its answer is a few hundred bytes a row, not
    its block's (rows x T) arrays, whatever the number of sessions."""
    panel, master = market
    plan = plan_model(panel, master, PARAMS)
    grid = chunks.ChunkGrid(N, T)
    start, stop = grid.rows(1)
    rank = plan.cap_ranks()
    assert rank is not None
    job = distributed.BlockJob(
        folder=str(tmp_path),
        previous=None,
        grid=grid,
        b0=1,
        b1=2,
        rows=plan.block(start, stop),
        prices={name: getattr(panel, name)[start:stop] for name in distributed.PRICE_INPUTS},
        rank=rank[start:stop],
    )
    done = distributed._write_task(plan.shared, job, None)
    answer = len(pickle.dumps(done))
    rows = stop - start
    assert answer < rows * 8 * 64  # about one value per metric a row
    assert done.nbytes() == rows * 8 * (2 + len(done.latest))
    outputs = rows * T * 8 * len(done.names)
    assert answer < outputs / 50
    files = sorted(p.name for p in (tmp_path / "arrays" / "_rows").iterdir())
    own = [chunks.group_path(1, c) for c in range(grid.chunks)]
    own += [chunks.runs_path(1, c) for c in range(grid.chunks)]
    assert files == sorted(p.name for p in own)  # its block's chunks (and their runs) only


def _perturbed(run_block: Any, row: int) -> Any:
    """`run_block` with one bit of `l1_res_er` changed at global row `row` (a field no longer
    derivable from `l1_mkt_er` there)."""

    def run(shared: Any, block: Any) -> dict[str, np.ndarray]:
        out = run_block(shared, block)
        if block.start <= row < block.stop:
            values = out["l1_res_er"]
            t = int(np.flatnonzero(np.isfinite(values[row - block.start]))[-1])
            values[row - block.start, t] = np.nextafter(values[row - block.start, t], 2.0)
        return dict(out)

    return run


def test_a_field_one_block_cannot_derive_is_stored_by_every_block(
    market: tuple[Panel, pd.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block 1 cannot derive `l1_res_er`; blocks 0 and 2 could and are written again storing
    it, as the local build (which checks the whole array) stores it."""
    from distributed import Client, LocalCluster

    from eqrisk.build import pipeline as build

    panel, master = market
    row = chunks.BLOCK_SYMBOLS + 7
    monkeypatch.setattr(build, "run_block", _perturbed(model_run.run_block, row))
    monkeypatch.setattr(distributed, "run_block", _perturbed(model_run.run_block, row))
    local = publish_panel(tmp_path / "local", panel, master, PARAMS, full=True)
    said: list[str] = []
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = plan_model(panel, master, PARAMS)
        staged, _names = distributed.write_model_dask(
            InMemory(plan), client, tmp_path / "staging", block_rows=1, progress=said.append
        )
    assert "l1_res_er" not in staged.arrays["derived"]
    assert "l1_res_er" not in local["arrays"]["derived"]
    assert staged.arrays == local["arrays"]
    assert "2 blocks written again: a field not derivable everywhere is stored" in said
    a = chunks.open_arrays(
        snapshots_dir(tmp_path / "local") / local["model_version"], local["arrays"]
    )
    b = chunks.open_arrays(tmp_path / "staging", staged.arrays)
    for name in a:
        assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name
