"""Versions that share history: chunked arrays read back exactly as the dense arrays they were,
a new version stores only the chunks that changed (hard links to the rest), pruning never frees
a chunk a kept version uses, and a damaged chunk is refused when the version is opened."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eqrisk.build.pipeline import build_snapshot
from eqrisk.data.ingest import ingest
from eqrisk.model.run import ModelParams
from eqrisk.snapshot import chunks, tables
from eqrisk.snapshot.versions import (
    Snapshot,
    SnapshotError,
    SnapshotStore,
    _prune,
    current_version,
    list_versions,
    snapshots_dir,
)

GRID = chunks.ChunkGrid(n=11, t=53, block=4, chunk=8)


def _dense(seed: int = 0) -> np.ndarray:
    """An (11 x 53) field with NaN runs, an all-NaN chunk, an all-NaN block-chunk and -0.0."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(GRID.n, GRID.t))
    a[:, 8:16] = np.nan  # chunk 1 empty in every block
    a[4:8, 40:48] = np.nan  # block 1 x chunk 5 empty
    a[2, :30] = np.nan
    a[9, 50] = -0.0
    return a


def _write(tmp_path: Path, fields: dict[str, np.ndarray], previous: Path | None = None):
    folder = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    arrays, stats = chunks.write_arrays(folder, fields, GRID, previous=previous)
    return folder, chunks.open_arrays(folder, arrays), arrays, stats


def _same(got: object, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.float64
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # bitwise, NaN and -0.0 too


def test_a_chunked_array_reads_back_every_index_form_bitwise(tmp_path: Path) -> None:
    dense = _dense()
    _, opened, arrays, stats = _write(tmp_path, {"x": dense})
    x = opened["x"]
    assert x.shape == dense.shape and len(x) == GRID.n
    # 3 blocks x 7 chunks; chunk 1 of every block and (1, 5) are all NaN: not stored.
    assert arrays["chunks"]["x"][1][5] == chunks.EMPTY
    assert stats.empty == 4 and stats.written == 3 * 7 - 4
    rows, cols = [0, 3, 4, 10, 10, 7], [0, 52, 9, 8, 50, 47]
    for key in [
        (5, slice(0, 53)),
        (5, slice(3, 47)),
        (2, slice(7, 9)),
        (10, slice(52, 53)),
        (3, slice(10, 10)),
        (-1, slice(None)),
        (9, 50),
        (4, -1),
        (slice(None), -1),
        (slice(None), 12),
        (slice(2, 9), slice(5, 30)),
        (slice(None), slice(None, None, 3)),
        (np.array([1, 9, 4]), slice(6, 20)),
        (3, np.array([0, 12, 52, 40])),
        (8, np.array([51, 7, 7, 8])),  # one row, sessions in any order, repeated
        (0, np.array([13])),
        (0, np.array([], dtype=np.int64)),
        (10, 8),
        (2, 20),  # a chunk that is not stored: NaN
        (rows, cols),
        (np.array(rows)[:, None], np.array([1, 44])[None, :]),
        (np.arange(GRID.n) % 2 == 0, 17),
    ]:
        _same(x[key], dense[key])
    _same(x[6], dense[6])
    _same(np.asarray(x), dense)
    assert x[9, 50] == 0.0 and np.signbit(x[9, 50])
    with pytest.raises(IndexError):
        x[11, 0]


def test_chunks_are_stored_in_the_narrowest_exact_dtype(tmp_path: Path) -> None:
    counts = np.tile(np.arange(GRID.t, dtype=np.float64) % 253, (GRID.n, 1))
    ranks = np.where(np.arange(GRID.t) % 5 == 0, np.nan, 300.0 + np.arange(GRID.t))
    ranks = np.tile(ranks, (GRID.n, 1))
    halves = np.tile(np.arange(GRID.t) / 2.0, (GRID.n, 1))
    big = np.tile(1000.0 + np.arange(GRID.t), (GRID.n, 1))
    fields = {"n_obs": counts, "rank": ranks, "half": halves, "big": big, "x": _dense()}
    folder, opened, arrays, _ = _write(tmp_path, fields)
    assert set("".join(arrays["chunks"]["n_obs"])) == {"B"}  # 0..252: one byte
    assert set("".join(arrays["chunks"]["big"])) == {"H"}
    assert set("".join(arrays["chunks"]["rank"])) == {"f"}  # NaN: a float, exact in 32 bits
    assert set("".join(arrays["chunks"]["half"])) == {"f"}
    assert set("".join(arrays["chunks"]["x"])) == {"d", chunks.EMPTY}
    assert np.load(folder / "arrays/n_obs/0.0.npy").dtype == np.uint8
    for name, dense in fields.items():
        _same(np.asarray(opened[name]), dense)


def test_a_field_is_derived_only_when_the_rule_gives_back_every_bit(tmp_path: Path) -> None:
    ret, cfr, er = _dense(1), _dense(2), np.abs(_dense(3)) / 10
    fields = {
        "return": ret,
        "l1_cfr": cfr,
        "l1_rr": ret - cfr,
        "l1_mkt_er": er,
        "l1_res_er": 1 - er,
        "l1_mkt_hr": _dense(4),
        "beta_mkt": _dense(4),
    }
    bent = (ret - cfr).copy()
    bent[3, 33] = np.nextafter(bent[3, 33], np.inf)  # one ulp off: must be stored
    _, opened, arrays, stats = _write(tmp_path, {**fields, "l2_cfr": cfr, "l2_rr": bent})
    assert sorted(arrays["derived"]) == ["beta_mkt", "l1_res_er", "l1_rr"]
    assert stats.derived == ["beta_mkt", "l1_res_er", "l1_rr"]
    assert "l2_rr" in arrays["chunks"] and "l1_rr" not in arrays["chunks"]
    for name, dense in {**fields, "l2_rr": bent}.items():
        _same(np.asarray(opened[name]), dense)
        _same(opened[name][5, 3:41], dense[5, 3:41])
        _same(opened[name][[1, 7], [52, 0]], dense[[1, 7], [52, 0]])


def test_a_new_version_links_equal_chunks_and_writes_only_changed_ones(tmp_path: Path) -> None:
    dense = _dense()
    first, _, _, stats = _write(tmp_path, {"x": dense})
    same, _, _, again = _write(tmp_path, {"x": dense}, previous=first)
    assert (again.written, again.shared, again.bytes_written) == (0, stats.written, 0)
    for path in (same / "arrays" / "_rows").iterdir():
        assert path.samefile(first / "arrays" / "_rows" / path.name)
    # Two more sessions (53 -> 55): only the last chunk of each block changes (48..55).
    longer = np.concatenate([dense, np.random.default_rng(9).normal(size=(GRID.n, 2))], axis=1)
    counts = np.tile(np.minimum(np.arange(55), 252.0), (GRID.n, 1))
    grid = chunks.ChunkGrid(GRID.n, 55, GRID.block, GRID.chunk)
    chunks.write_arrays(tmp_path / "base", {"x": longer[:, :53], "n": counts[:, :53]}, GRID)
    folder = tmp_path / "appended"
    arrays, grown = chunks.write_arrays(
        folder, {"x": longer, "n": counts}, grid, previous=tmp_path / "base"
    )
    # A group's runs index is rewritten only where a row's runs changed (not here: it is
    # linked like any equal file).
    assert sorted(grown.written_files) == sorted(
        [f"arrays/_rows/{b}.6.npy" for b in range(3)] + [f"arrays/n/{b}.6.npy" for b in range(3)]
    )
    for b in range(3):
        rel = f"arrays/_rows/{b}.6.runs.npy"
        assert (folder / rel).samefile(tmp_path / "base" / rel)
    # A group file and its runs index count as one chunk.
    data_files = [p for p in (tmp_path / "base").rglob("*.npy") if ".runs." not in p.name]
    assert grown.shared == len(data_files) - 6
    opened = chunks.open_arrays(folder, arrays)
    _same(np.asarray(opened["x"]), longer)
    _same(np.asarray(opened["n"]), counts)


def test_writers_side_by_side_write_what_one_writes(tmp_path: Path) -> None:
    """`write_block(..., writers=3)` writes each time chunk on one of three threads: the same
    files, bit for bit, the same codes and the same stats (files in chunk order) as one
    writer, with or without a previous version to link from."""
    dense, other = _dense(), _dense(seed=4)
    counts = np.tile(np.minimum(np.arange(GRID.t), 252.0), (GRID.n, 1))
    fields = {"x": dense, "y": other, "n": counts}
    base = tmp_path / "base"
    for b in range(GRID.blocks):
        chunks.write_block(base, {"x": dense, "y": dense, "n": counts}, GRID, b)
    for previous in (None, base):
        got = {}
        for writers in (1, 3):
            folder = tmp_path / f"w{writers}-{previous is not None}"
            stats = chunks.WriteStats()
            codes = [
                chunks.write_block(folder, fields, GRID, b, previous=previous, stats=stats,
                                   writers=writers)
                for b in range(GRID.blocks)
            ]  # fmt: skip
            files = {
                str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.npy"))
            }
            got[writers] = (codes, stats, files)
        assert got[1][0] == got[3][0]
        assert got[1][1] == got[3][1]
        assert got[1][2] == got[3][2]
        assert got[3][1].written > 0 and (previous is None or got[3][1].shared > 0)


def test_a_damaged_previous_chunk_is_rewritten_not_linked(tmp_path: Path) -> None:
    dense = _dense()
    first, _, _, _ = _write(tmp_path, {"x": dense})
    victim = first / "arrays" / "_rows" / "0.0.npy"
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 8)
    second, opened, _, stats = _write(tmp_path, {"x": dense}, previous=first)
    assert stats.written == 1 and not (second / "arrays/_rows/0.0.npy").samefile(victim)
    _same(np.asarray(opened["x"]), dense)


# ------------------------------------------------------------------------ built versions


@pytest.fixture()
def home(demo_home: Path, tmp_path: Path) -> Path:
    target = tmp_path / "home"
    shutil.copytree(demo_home, target)
    return target


def _new_bytes(folder: Path) -> dict[str, int]:
    """Files of a version that no other version links (what the version added to the disk)."""
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.stat().st_nlink == 1
    }


def test_every_served_value_equals_the_models_arrays(home: Path, monkeypatch) -> None:
    """Build, keep the model's in-memory arrays, and compare what the snapshot serves."""
    kept = {}
    write = tables.write_content

    def keep(folder, content, **kwargs):
        kept["content"] = content
        return write(folder, content, **kwargs)

    monkeypatch.setattr(tables, "write_content", keep)
    manifest = build_snapshot(home, ModelParams())
    content = kept["content"]
    snap = SnapshotStore(home).current()
    assert snap.version == manifest["model_version"] and snap.chunked
    model = dict(content.result.metrics)
    model.update({name: getattr(content.panel, name) for name in tables.PANEL_ARRAYS})
    assert sorted(model) == manifest["fields"]
    n, t = model["return"].shape
    rng = np.random.default_rng(3)
    rows = rng.choice(n, 12, replace=False)
    for name, want in model.items():
        want = np.asarray(want, dtype=np.float64)
        got = snap.array(name)
        _same(np.asarray(got), want)
        for r in rows:
            lo = int(rng.integers(0, t))
            _same(got[r, lo:t], want[r, lo:t])
        _same(got[:, -1], want[:, -1])
    assert set(manifest["arrays"]["derived"]) >= {"beta_mkt", "l1_rr", "l2_rr", "l3_rr"}


def test_a_rebuild_on_the_same_data_shares_every_chunk(home: Path) -> None:
    first = current_version(home)
    manifest = build_snapshot(home, ModelParams())
    storage = manifest["storage"]
    assert storage["previous"] == first
    assert storage["chunks_written"] == 0 and storage["bytes_written"] == 0
    files = list((snapshots_dir(home) / first).glob("arrays/*/*.npy"))
    files = [p for p in files if ".runs." not in p.name]  # counted with their group file
    files += list((snapshots_dir(home) / first).glob("security_history/*.parquet"))
    assert storage["chunks_shared"] == len(files) > 50
    added = _new_bytes(snapshots_dir(home) / manifest["model_version"])
    assert sorted(added) == ["factors.npy", "manifest.json", "sessions.npy", "symbols.parquet"]
    full = sum(p.stat().st_size for p in (snapshots_dir(home) / first).rglob("*") if p.is_file())
    assert sum(added.values()) < 0.01 * full


def test_appending_a_session_rewrites_only_the_chunks_it_touches(
    demo_home: Path, tmp_path: Path
) -> None:
    """Ingest the demo prices without their last session, build, ingest them whole, build: each
    stored field rewrites its last chunk, the long table its yearly file (its daily rows are
    the arrays')."""
    home = tmp_path / "append"
    prices = pd.read_csv(demo_home / "demo" / "demo_prices.csv.gz")
    last = prices["date"].max()
    short = tmp_path / "short.csv.gz"
    prices[prices["date"] < last].to_csv(short, index=False)
    master = demo_home / "demo" / "demo_master.csv"
    ingest([short], master, home=home, data_source="demo-synthetic")
    old = build_snapshot(home, ModelParams())
    ingest([demo_home / "demo" / "demo_prices.csv.gz"], master, home=home, replace=True)
    new = build_snapshot(home, ModelParams())
    assert new["sessions"] == old["sessions"] + 1
    grid = chunks.ChunkGrid.of(new["arrays"]["grid"])
    assert grid.blocks == 1
    last = grid.chunks - 1
    own = [name for name, codes in new["arrays"]["chunks"].items() if codes[0][-1] in "BHf"]
    assert "n_obs" in own and "l3_mkt_hr" not in own  # float64 fields share the group file
    year = str(new["data_as_of"])[:4]
    # The group file (with its runs index) and the narrow fields of the last chunk,
    # monthly-<year>.
    assert new["storage"]["chunks_written"] == 1 + len(own) + 1
    added = _new_bytes(snapshots_dir(home) / new["model_version"])
    # (the group's runs index is new only where a row's runs changed: a symbol listed or
    # published a first value on the new day)
    assert {p for p in added if p.startswith("arrays/") and ".runs." not in p} == {
        f"arrays/_rows/0.{last}.npy",
        *(f"arrays/{name}/0.{last}.npy" for name in own),
    }
    assert sorted(p for p in added if p.startswith("security_history/")) == [
        f"security_history/monthly-{year}.parquet",
    ]
    full = sum(p.stat().st_size for p in (snapshots_dir(home) / old["model_version"]).rglob("*"))
    assert sum(added.values()) < 0.1 * full
    # The old version still reads its own values; the new one the new session.
    old_snap = Snapshot.open(snapshots_dir(home) / old["model_version"])
    new_snap = Snapshot.open(snapshots_dir(home) / new["model_version"])
    for name in ("l3_mkt_hr", "price_close", "n_obs", "l1_rr"):
        _same(new_snap.array(name)[:, : old["sessions"]], np.asarray(old_snap.array(name)))


def test_pruning_keeps_the_chunks_a_kept_version_uses(home: Path) -> None:
    first = current_version(home)
    before = np.asarray(Snapshot.open(snapshots_dir(home) / first).array("l3_mkt_hr"))
    second = build_snapshot(home, ModelParams(), keep=3)["model_version"]
    folder = snapshots_dir(home) / second
    linked = list(folder.glob("arrays/*/*.npy"))
    assert len(linked) > 50 and all(p.stat().st_nlink == 2 for p in linked)
    assert _prune(home, keep=1) == [first]
    assert list_versions(home) == [second]
    assert all(p.stat().st_nlink == 1 for p in linked)  # the data stayed, now one link
    snap = Snapshot.open(folder)
    _same(np.asarray(snap.array("l3_mkt_hr")), before)
    assert len(snap.security_history(symbol="MSFT")) > 1000


def test_a_damaged_or_missing_chunk_is_refused_at_open(home: Path) -> None:
    folder = snapshots_dir(home) / current_version(home)
    chunk = sorted((folder / "arrays" / "_rows").glob("*.npy"))[-1]
    saved = chunk.read_bytes()
    with open(chunk, "r+b") as fh:
        fh.truncate(len(saved) - 1)
    with pytest.raises(SnapshotError, match=rf"arrays/_rows/{chunk.name} holds \d+ bytes"):
        Snapshot.open(folder)
    chunk.unlink()
    with pytest.raises(SnapshotError, match=rf"arrays/_rows/{chunk.name} is missing"):
        Snapshot.open(folder)
    chunk.write_bytes(saved)
    Snapshot.open(folder)
    daily = sorted((folder / "security_history").glob("monthly-*.parquet"))[0]
    daily.rename(daily.with_suffix(".bak"))
    with pytest.raises(SnapshotError, match=rf"{daily.name} is missing"):
        Snapshot.open(folder)


def test_a_long_row_read_assembles_the_row_once_for_the_next_fields(tmp_path: Path) -> None:
    fields = {"a": _dense(5), "b": _dense(6), "n": np.tile(np.arange(53.0) % 9, (GRID.n, 1))}
    fields["empty"] = np.full((GRID.n, GRID.t), np.nan)
    _, opened, _, _ = _write(tmp_path, fields)
    store = opened["a"].store
    assert store.names == ["a", "b", "n"]  # grouped fields first; a field never stored: no row
    _same(opened["b"][6, 17:20], fields["b"][6, 17:20])  # two chunks: read from them
    assert store._rows == {}
    _same(opened["a"][6, 1:50], fields["a"][6, 1:50])  # a long read assembles row 6
    assert list(store._rows) == [6] and not store._rows[6].flags.writeable
    for name in fields:
        _same(opened[name][6, 3:44], fields[name][6, 3:44])  # from the kept row
        _same(opened[name][6], fields[name][6])
    _same(store.full_row(6), np.stack([fields[n][6] for n in ("a", "b", "n")]))
    assert list(store._rows) == [6]
    store.forget()
    assert store._rows == {}


def test_a_fields_own_row_is_read_without_assembling_the_row(tmp_path: Path) -> None:
    """`field_span` (a batch's prices): every span of every row, bit for bit the field's,
    from the field's own runs (narrow dtypes and a field never stored too), and no row is
    assembled or cached for it; a dense array is sliced."""
    fields = {"a": _dense(5), "b": _dense(6), "n": np.tile(np.arange(53.0) % 9, (GRID.n, 1))}
    fields["a"][2, :30] = np.nan  # listed late
    fields["b"][5] = np.nan  # no such level for row 5
    fields["empty"] = np.full((GRID.n, GRID.t), np.nan)
    _, opened, _, _ = _write(tmp_path, fields)
    store = opened["a"].store
    for name, want in fields.items():
        for r in range(GRID.n):
            for lo, hi in ((0, GRID.t), (1, 50), (17, 29), (40, 41), (30, 30)):
                _same(chunks.field_span(opened[name], r, lo, hi), want[r, lo:hi])
    assert store._rows == {}  # long spans too: nothing assembled
    dense = fields["a"]
    _same(chunks.field_span(dense, 2, 3, 40), dense[2, 3:40])
