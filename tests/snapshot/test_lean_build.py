"""A build that reuses nothing reads the whole universe's model fields only (the adjusted close
and the cap) and each block's other price fields when it writes the block (`read_rows`): its
version (every file and every input digest) equals, bit for bit, the version built from the
panel read whole; the rows a block reads equal the whole panel's; a panel read without a field
refuses to give it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eqrisk.bench.daily import ingest_meta, synthetic_prices
from eqrisk.build.incremental import RowDigests, input_digests
from eqrisk.build.pipeline import build_snapshot, publish_panel
from eqrisk.build.universe import open_universe
from eqrisk.data.corporate_actions import return_breaks
from eqrisk.data.ingested import ingested_dir, read_panel, read_rows, stored, write_ingested
from eqrisk.data.master import Mappings
from eqrisk.data.panel import MODEL_FIELDS, PANEL_FIELDS
from eqrisk.data.share_classes import read_share_classes
from eqrisk.model.run import ModelParams, plan_model
from eqrisk.snapshot.chunks import BLOCK_SYMBOLS
from eqrisk.snapshot.tables import PANEL_ARRAYS
from eqrisk.snapshot.versions import Snapshot, snapshots_dir

N, T = 130, 700
PARAMS = ModelParams(window=126, min_obs=60)
BLOCK = 32  # the chunk grid's block: five blocks, across the ingested blocks of 40


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prices, _day, master = synthetic_prices(N, T, seed=7)
    # A raw close that is not the adjusted one (a dividend payer's), for some symbols.
    payers = prices["symbol"].isin(sorted(prices["symbol"].unique())[::5])
    prices.loc[payers, "close_raw"] = prices.loc[payers, "close"] * 1.25
    # No technology ETF: that sector is a cap-weighted group with leave-one-out rows.
    prices = prices[prices["symbol"] != "XLK"]
    folder = tmp_path_factory.mktemp("lean") / "home"
    meta = ingest_meta(prices, master)
    # Returns left out at ingest, on both sides of a slice of the streamed plan (512).
    days = sorted(prices["date"].unique())
    meta["return_breaks"] = [
        ["S00002", str(days[100])[:10]], ["S00014", str(days[511])[:10]],
        ["S00014", str(days[512])[:10]], ["S00040", str(days[690])[:10]],
    ]  # fmt: skip
    write_ingested(folder, prices, master, meta, block_symbols=40)
    return folder


def _manifest(version: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((version / "manifest.json").read_text())
    return manifest


def test_the_rows_a_block_reads_equal_the_whole_panels(home: Path) -> None:
    found, raw, _master = open_universe(home, Mappings.load(), "SPY")
    assert found is not None and len(found.stats.parts()) > 3
    whole = read_panel(found, raw)
    lean = read_panel(found, raw, fields=MODEL_FIELDS)
    assert lean.read == MODEL_FIELDS and whole.read == PANEL_FIELDS
    for name in MODEL_FIELDS:
        np.testing.assert_array_equal(getattr(lean, name), getattr(whole, name))
    for start, stop in ((0, 32), (30, 95), (96, 130), (0, 130)):  # across ingested blocks
        got = read_rows(found, whole.symbols[start:stop], whole.sessions, PANEL_ARRAYS)
        assert set(got) == set(PANEL_ARRAYS)
        for name in PANEL_ARRAYS:
            np.testing.assert_array_equal(got[name], getattr(whole, name)[start:stop])
    # Payers' raw close differs from the adjusted one: the two are not mixed up.
    assert np.nanmax(np.abs(whole.close_raw - whole.close)) > 0
    # A field the panel was read without is refused, not read as NaN.
    plan = plan_model(lean, _master, PARAMS)
    with pytest.raises(ValueError, match="read without close_raw, volume"):
        plan.price_rows(0, 10)
    with pytest.raises(ValueError, match="whole universe"):
        read_rows(found, whole.symbols[:3], whole.sessions, ("market_cap",))


def test_a_lean_full_build_equals_the_build_from_the_whole_panel(
    home: Path, tmp_path: Path
) -> None:
    found, raw, master = open_universe(home, Mappings.load(), "SPY")
    assert found is not None
    lean_home = home  # build_snapshot's first build reads the model fields only
    said: list[str] = []
    built = build_snapshot(lean_home, PARAMS, block_symbols=BLOCK, keep=5, progress=said.append)
    assert built["build"]["mode"] == "full"
    # Planned one slice of sessions at a time (`block_inputs.stream_plan`): two of 512.
    assert [m for m in said if m.startswith("planned")] == [
        "planned sessions 512/700",
        "planned sessions 700/700",
    ]
    whole = read_panel(found, raw, read_share_classes(None))
    other = tmp_path / "whole"
    breaks = return_breaks(found.meta["return_breaks"], whole.symbols, whole.sessions)
    assert breaks.sum() == 4
    want = publish_panel(
        other,
        whole,
        master,
        PARAMS,
        breaks=breaks,
        meta=found.meta,
        full=True,
        block_symbols=BLOCK,
        proof=built["inputs"]["data"],
    )
    got_dir = snapshots_dir(lean_home) / built["model_version"]
    want_dir = snapshots_dir(other) / want["model_version"]
    got, wanted = _manifest(got_dir), _manifest(want_dir)
    assert got["model"]["leave_one_out_rows"] > 0 and got["model"]["returns_excluded"] == 4
    assert got["model"] == wanted["model"]
    assert got["arrays"] == wanted["arrays"]
    # Every chunk's digest of every input, the fields the blocks read included.
    assert got["inputs"]["chunks"] == wanted["inputs"]["chunks"]
    assert got["inputs"]["universe"] == wanted["inputs"]["universe"]
    assert set(got["inputs"]["chunks"][0]["digests"]) >= set(PANEL_ARRAYS)
    files = sorted(p.relative_to(want_dir) for p in want_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(got_dir) for p in got_dir.rglob("*") if p.is_file())
    for path in files:
        if path.name != "manifest.json":
            assert (got_dir / path).read_bytes() == (want_dir / path).read_bytes(), path
    a, b = Snapshot.open(got_dir), Snapshot.open(want_dir)
    for name in ("open", "close_raw", "volume", "turnover", "l3_sub_hr"):
        np.testing.assert_array_equal(a.array(name)[:], b.array(name)[:])


def test_row_digests_equal_the_whole_arrays_and_want_rows_in_order(home: Path) -> None:
    found, raw, master = open_universe(home, Mappings.load(), "SPY")
    assert found is not None
    whole = read_panel(found, raw)
    want = input_digests(plan_model(whole, master, PARAMS), whole, master, None)
    fed = RowDigests(PANEL_ARRAYS, *whole.shape)
    bounds = [(0, 50), (50, 51), (51, 129)]
    for start, stop in bounds:
        fed.feed(start, {k: getattr(whole, k)[start:stop] for k in PANEL_ARRAYS})
    fed.feed(0, {k: getattr(whole, k)[:50] for k in PANEL_ARRAYS})  # read again: not fed twice
    lean = read_panel(found, raw, fields=MODEL_FIELDS)
    partial = input_digests(plan_model(lean, master, PARAMS), lean, master, None)
    assert "open" not in partial["chunks"][0]["digests"]
    assert fed.into(partial) == want
    gap = RowDigests(PANEL_ARRAYS, *whole.shape)
    with pytest.raises(RuntimeError, match="out of order"):
        gap.feed(10, {k: getattr(whole, k)[10:20] for k in PANEL_ARRAYS})
    with pytest.raises(RuntimeError, match="fed up to 0 of 129"):
        gap.into(partial)
    assert stored(home) is not None


def test_a_store_keeps_its_grid_and_a_new_one_starts_at_the_default(
    home: Path, tmp_path: Path
) -> None:
    """Unset, the grid's block is the current version's (an upgrade that changes the default
    does not make the next build a full one), and BLOCK_SYMBOLS for a first build."""
    kept = build_snapshot(home, PARAMS, block_symbols=BLOCK, keep=5)
    again = build_snapshot(home, PARAMS, keep=5)
    assert (
        _manifest(snapshots_dir(home) / again["model_version"])["arrays"]["grid"]["block"] == BLOCK
    )
    assert not any("block" in reason for reason in again["build"]["reasons"])
    assert kept["arrays"]["grid"]["block"] == BLOCK
    fresh = tmp_path / "fresh"
    found = stored(home)
    assert found is not None
    shutil.copytree(found.folder, fresh / "ingested")
    first = build_snapshot(fresh, PARAMS)
    assert first["arrays"]["grid"]["block"] == BLOCK_SYMBOLS == 512


def test_a_dask_build_that_reads_the_whole_history_is_planned_by_slices(
    home: Path, tmp_path: Path
) -> None:
    """A return break added to an early year changes the whole history: with Dask, the build
    is a full one planned one slice of sessions at a time (no universe-sized array in the
    builder), and its version equals the local full build's."""
    dask_home, local_home = tmp_path / "dask", tmp_path / "local"
    for copy in (dask_home, local_home):
        shutil.copytree(home, copy, symlinks=True)
        build_snapshot(copy, PARAMS, block_symbols=BLOCK, full=True)
        meta_path = ingested_dir(copy) / "meta.json"
        meta = json.loads(meta_path.read_text())
        days = sorted({d for _s, d in meta["return_breaks"]})
        meta["return_breaks"].append(["S00003", "1996-03-01"])
        assert days[0] > "1996-03-01"
        meta_path.write_text(json.dumps(meta))
    said: list[str] = []
    built = build_snapshot(dask_home, PARAMS, dask="local", dask_workers=2, progress=said.append)
    assert "reading the whole history: the return breaks changed" in said
    assert built["build"] == {"mode": "full", "reasons": ["a Dask build"]}
    assert "planned sessions 700/700" in said
    local = build_snapshot(local_home, PARAMS, full=True)
    assert built["model"]["returns_excluded"] == 5 == local["model"]["returns_excluded"]
    a = Snapshot.open(snapshots_dir(dask_home) / built["model_version"])
    b = Snapshot.open(snapshots_dir(local_home) / local["model_version"])
    assert a.manifest["arrays"] == b.manifest["arrays"]
    assert a.manifest["inputs"]["chunks"] == b.manifest["inputs"]["chunks"]
    for name in ("return", "l2_sec_hr", "mktcap_rank"):
        np.testing.assert_array_equal(a.array(name)[:], b.array(name)[:])
