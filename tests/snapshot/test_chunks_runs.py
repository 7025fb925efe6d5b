"""Layout `chunks-2` (issue 10, full store): a group file holds only the (row, field) runs
that have a number, the rows read back bitwise whatever their pattern of missing runs, the
older layout `chunks-1` is still read, the residual risk shares are derived where the
cascade's arithmetic gives their bits back, and an assembled row is never recycled while a
view of it is alive."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eqrisk.snapshot import chunks
from eqrisk.snapshot.spliced import Spliced

GRID = chunks.ChunkGrid(n=11, t=53, block=4, chunk=8)


def _fields() -> dict[str, np.ndarray]:
    """Three float64 fields whose runs are missing in different patterns: a listing date
    (row 2 before session 30), a field without a level for some rows (row 5, 6), a chunk
    where one field is entirely NaN (chunk 3 of `c`), a run missing in one field only."""
    rng = np.random.default_rng(3)
    a, b, c = (rng.normal(size=(GRID.n, GRID.t)) for _ in range(3))
    for x in (a, b, c):
        x[2, :30] = np.nan
    b[5:7] = np.nan  # no such level for rows 5 and 6
    c[:, 24:32] = np.nan  # chunk 3 of c: not stored at all
    a[9, 40:48] = np.nan  # one run of a
    c[10, 50] = -0.0
    return {"a": a, "b": b, "c": c}


def _same(got: object, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.float64
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def _write(folder: Path, fields: dict[str, np.ndarray]) -> dict:
    folder.mkdir()
    arrays, _stats = chunks.write_arrays(folder, fields, GRID)
    return arrays


def test_a_group_file_stores_only_the_runs_with_a_number(tmp_path: Path) -> None:
    fields = _fields()
    arrays = _write(tmp_path / "v", fields)
    assert arrays["layout"] == "chunks-2"
    for b, c in GRID.cells():
        r0, r1 = GRID.rows(b)
        c0, c1 = GRID.cols(c)
        members = [n for n in sorted(fields) if arrays["chunks"][n][b][c] == chunks.GROUPED]
        if not members:
            assert not (tmp_path / "v" / chunks.group_path(b, c)).exists()
            continue
        data = np.load(tmp_path / "v" / chunks.group_path(b, c))
        runs = np.load(tmp_path / "v" / chunks.runs_path(b, c))
        block = np.stack([fields[n][r0:r1, c0:c1] for n in members], axis=1)
        kept = ~np.isnan(block).all(axis=2)
        assert runs.dtype == np.int32 and runs.shape == (r1 - r0, len(members))
        assert data.shape == (int(kept.sum()), c1 - c0)
        assert (runs[~kept] == -1).all()
        assert sorted(runs[kept].tolist()) == list(range(int(kept.sum())))
        for (i, j), at in np.ndenumerate(runs):
            if at >= 0:
                _same(data[at], block[i, j])
    # Row 2 before its listing, rows 5-6 of b: none of their runs is stored.
    runs = np.load(tmp_path / "v" / chunks.runs_path(0, 0))
    assert (runs[2] == -1).all()
    runs = np.load(tmp_path / "v" / chunks.runs_path(1, 0))
    assert runs[1, 1] == -1 and runs[2, 1] == -1 and runs[1, 0] >= 0


def test_every_row_pattern_reads_back_bitwise(tmp_path: Path) -> None:
    fields = _fields()
    opened = chunks.open_arrays(tmp_path / "v", _write(tmp_path / "v", fields))
    store = opened["a"].store
    for name, want in fields.items():
        x = opened[name]
        _same(np.asarray(x), want)
        for r in range(GRID.n):
            _same(x[r], want[r])  # a long read: the assembled row
            _same(x[r, 17:29], want[r, 17:29])  # two chunks: the field's runs
            assert x[r, 42] == want[r, 42] or (np.isnan(x[r, 42]) and np.isnan(want[r, 42]))
        _same(x[[2, 5, 9], [3, 20, 44]], want[[2, 5, 9], [3, 20, 44]])
        _same(x[:, 25], want[:, 25])
        _same(x[4:9, 20:50], want[4:9, 20:50])
    for r in range(GRID.n):
        _same(store.full_row(r), np.stack([fields[n][r] for n in store.names]))


def test_a_chunks_1_version_is_still_read(tmp_path: Path) -> None:
    """A version of the layout before (group files of every run, no runs index) reads back
    bitwise: the chunks-2 files are rewritten here as chunks-1 wrote them."""
    fields = _fields()
    folder = tmp_path / "v"
    arrays = _write(folder, fields)
    for b, c in GRID.cells():
        r0, r1 = GRID.rows(b)
        c0, c1 = GRID.cols(c)
        members = [n for n in sorted(fields) if arrays["chunks"][n][b][c] == chunks.GROUPED]
        if members:
            dense = np.stack([fields[n][r0:r1, c0:c1] for n in members], axis=1)
            np.save(folder / chunks.group_path(b, c), dense)
            (folder / chunks.runs_path(b, c)).unlink()
    old = {**arrays, "layout": "chunks-1"}
    (folder / "arrays.json").write_text(json.dumps(old))
    assert [p for p in chunks.expected_chunks(old) if ".runs." in str(p[0])] == []
    opened = chunks.open_arrays(folder, old)
    for name, want in fields.items():
        _same(np.asarray(opened[name]), want)
        for r in range(GRID.n):
            _same(opened[name][r], want[r])
            _same(opened[name][r, 5:12], want[r, 5:12])
    with pytest.raises(ValueError, match="unknown chunk layout"):
        chunks.open_arrays(folder, {**arrays, "layout": "chunks-9"})


def _cascade_shares(n: int, t: int) -> dict[str, np.ndarray]:
    """Risk shares as the cascade writes them: rows 0-1 an ETF (L1 carried into the L2/L3
    columns, sector and subsector NaN), rows 2-4 without a subsector, row 5 collinear at L2
    on some days, the others every level; residuals by the cascade's own arithmetic."""
    rng = np.random.default_rng(5)
    m, s, u = (rng.uniform(0, 0.4, size=(n, t)) for _ in range(3))
    out = {"l2_mkt_er": m.copy(), "l3_mkt_er": m.copy(), "l2_sec_er": s.copy()}
    out["l3_sec_er"], out["l3_sub_er"] = s.copy(), u.copy()
    out["l3_sec_er"][:2] = out["l2_sec_er"][:2] = np.nan
    out["l3_sub_er"][:5] = np.nan
    out["l2_res_er"] = 1.0 - m - s
    out["l3_res_er"] = 1.0 - m - s - u
    out["l2_res_er"][:2] = out["l3_res_er"][:2] = 1.0 - m[:2]
    out["l3_res_er"][2:5] = 1.0 - m[2:5] - s[2:5]
    for name in out:  # L2 collinear: every L2/L3 share of row 5 NaN those days
        out[name][5, 10:20] = np.nan
    return out


def test_residual_shares_are_derived_when_the_cascade_arithmetic_gives_their_bits(
    tmp_path: Path,
) -> None:
    fields = _cascade_shares(9, 40)
    grid = chunks.ChunkGrid(9, 40, 4, 8)
    for name in ("l2_res_er", "l3_res_er"):
        assert chunks.derivable(name, fields, grid)
    tmp_path.joinpath("v").mkdir()
    arrays, _stats = chunks.write_arrays(tmp_path / "v", fields, grid)
    assert {"l2_res_er", "l3_res_er"} <= set(arrays["derived"])
    opened = chunks.open_arrays(tmp_path / "v", arrays)
    for name in ("l2_res_er", "l3_res_er"):
        _same(np.asarray(opened[name]), fields[name])
        _same(opened[name][3], fields[name][3])
        got = opened[name][0, 7]
        assert np.isscalar(got) and got == fields[name][0, 7]  # one value stays a scalar
    # One bit off (a row whose residual the model computed otherwise): stored, exact.
    bent = dict(fields)
    bent["l3_res_er"] = fields["l3_res_er"].copy()
    bent["l3_res_er"][7, 30] = np.nextafter(bent["l3_res_er"][7, 30], 2.0)
    assert not chunks.derivable("l3_res_er", bent, grid)
    tmp_path.joinpath("w").mkdir()
    arrays, _ = chunks.write_arrays(tmp_path / "w", bent, grid)
    assert "l3_res_er" not in arrays["derived"] and "l2_res_er" in arrays["derived"]
    _same(np.asarray(chunks.open_arrays(tmp_path / "w", arrays)["l3_res_er"]), bent["l3_res_er"])


def test_an_assembled_row_with_a_live_view_is_never_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = _fields()
    opened = chunks.open_arrays(tmp_path / "v", _write(tmp_path / "v", fields))
    store = opened["a"].store
    monkeypatch.setattr(store, "_keep", 2)
    recycled = []
    assemble = store.full_row

    def spy(r: int, out: np.ndarray | None = None) -> np.ndarray:
        recycled.append(out is not None)
        return assemble(r, out)

    monkeypatch.setattr(store, "full_row", spy)
    held = opened["a"][9]  # a view of row 9's assembled row
    first = opened["b"][0]
    for r in range(GRID.n):  # every row assembled: rows 9 and 0 evicted long ago
        opened["c"][r]
    del first  # row 0 is no longer referenced: its memory may serve another row
    for r in range(GRID.n):
        opened["a"][r]
    _same(held, fields["a"][9])  # still row 9's values
    assert any(recycled)  # evicted rows nobody held served later rows
    for r in range(GRID.n):
        _same(opened["b"][r], fields["b"][r])  # recycled memory holds the right rows


def test_forgotten_rows_lend_their_memory_to_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows dropped from the cache (evicted, or all at once by `forget`) keep their memory for
    the next assemblies, as many as the cache holds: a new (fields x T) array is fresh memory
    whose pages fault on first write, which costs as much as the assembly itself."""
    fields = _fields()
    opened = chunks.open_arrays(tmp_path / "v", _write(tmp_path / "v", fields))
    store = opened["a"].store
    monkeypatch.setattr(store, "_keep", 4)
    given: list[bool] = []
    assemble = store.full_row

    def spy(r: int, out: np.ndarray | None = None) -> np.ndarray:
        given.append(out is not None)
        return assemble(r, out)

    monkeypatch.setattr(store, "full_row", spy)
    for r in range(4):
        opened["a"][r]
    store.forget()
    given.clear()
    for r in range(4, 8):
        _same(opened["b"][r], fields["b"][r])
    assert given == [True] * 4  # every row of the pass assembled into recycled memory


def test_a_spliced_field_reads_the_previous_versions_sessions_bitwise(tmp_path: Path) -> None:
    """A field an incremental build writes (`Spliced`: its new sessions in memory, the earlier
    ones the previous version's chunks) reads back, for every range of rows and sessions on
    either side of its start or across it, the previous version's bits then the new ones, with
    each chunk's part copied from its file or group (a chunk not stored reads NaN)."""
    fields = _fields()
    opened = chunks.open_arrays(tmp_path / "v", _write(tmp_path / "v", fields))
    start = 27
    for name, old in fields.items():
        new = old[:, start:] + 1.0  # the new sessions differ from the stored ones
        spliced = Spliced(new, start, opened[name])
        want = np.concatenate([old[:, :start], new], axis=1)
        for r0, r1 in ((0, 11), (1, 4), (3, 9), (5, 6), (7, 7)):
            for c0, c1 in ((0, 53), (0, 27), (5, 30), (8, 16), (23, 33), (26, 28), (30, 40)):
                _same(spliced[r0:r1, c0:c1], want[r0:r1, c0:c1])


def test_every_span_reads_back_bitwise_and_close_files_before_keeps_the_later_chunks(
    tmp_path: Path,
) -> None:
    """`a[r0:r1, c0:c1]` (the risk model's reads of a written version: each chunk's part
    copied from its own file or its group's runs) is the field's bits for every range of rows
    and sessions, whatever the missing runs; `close_files(before=s)` unmaps the chunks that end
    at or before session s only, and the reads after it are the same bits (reopened or not)."""
    fields = _fields()
    opened = chunks.open_arrays(tmp_path / "v", _write(tmp_path / "v", fields))
    store = opened["a"]._store
    for name, want in fields.items():
        for r0, r1 in ((0, 11), (1, 4), (3, 9), (5, 6), (7, 7)):
            for c0, c1 in ((0, 53), (5, 30), (8, 16), (23, 33), (47, 53), (12, 12)):
                _same(opened[name][r0:r1, c0:c1], want[r0:r1, c0:c1])
    assert {c for c in store._file_chunk.values()} == set(range(GRID.chunks))
    chunks.close_files(opened, before=20)  # chunks 0 and 1 end at or before session 20
    assert {c for c in store._file_chunk.values()} == set(range(2, GRID.chunks))
    assert set(store._files) == set(store._file_chunk)
    assert all(c >= 2 for _b, c in [*store._groups, *store._cells])
    for name, want in fields.items():
        _same(opened[name][:, 3:50], want[:, 3:50])
    chunks.close_files(opened)
    assert not store._files and not store._file_chunk and not store._groups
