"""The assembled row (`ChunkStore.full_row`, compiled in `row_kernel`): every stored field of a
row and the derived ones, bitwise equal to the dense arrays and to `chunks.derive`, whatever
the mix of group files, narrow own chunks (uint8, uint16, float32) and runs without a number;
long reads of derived and never-stored fields are views, not computations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eqrisk.snapshot import chunks, row_kernel

GRID = chunks.ChunkGrid(n=13, t=61, block=5, chunk=8)  # a last chunk of 5 sessions


def _same(got: object, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.float64
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # NaN and -0.0 too


def _fields() -> dict[str, np.ndarray]:
    """Float64 fields with missing runs, cascade-like shares whose residuals derive exactly,
    and narrow fields: counts (uint8 and uint16 chunks) and a rank stored as float32 in some
    chunks and grouped (float64) in others, so that an own chunk sits between group rows."""
    rng = np.random.default_rng(11)
    n, t = GRID.n, GRID.t
    ret, cfr = rng.normal(size=(n, t)), rng.normal(size=(n, t))
    m, s = rng.uniform(0, 0.4, size=(n, t)), rng.uniform(0, 0.4, size=(n, t))
    s[:3] = np.nan  # rows without the sector level
    m[4, 20:40] = np.nan
    ret[7, :25] = cfr[7, :25] = np.nan  # a late listing
    ret[9, 60] = -0.0
    counts = np.tile(np.arange(t, dtype=np.float64) % 200, (n, 1))
    counts[:, 40:] += 1000  # uint16 from chunk 5 on
    rank = np.round(rng.uniform(1, 500, size=(n, t)))
    rank[:, 24:32] += 0.1  # float64 (grouped) in chunk 3: not exact in float32
    rank[:, 48:56] = np.float32(0.3)  # float32 in chunk 6
    fields = {
        "ret": ret,
        "cfr": cfr,
        "mkt_er": m,
        "sec_er": s,
        "rr": ret - cfr,
        "res_er": chunks.derive("one_minus_known", [m, s]),
        "count": counts,
        "rank": rank,
        "never": np.full((n, t), np.nan),
    }
    fields["alias"] = fields["ret"]
    return fields


@pytest.fixture
def opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, chunks.FieldArray]:
    monkeypatch.setitem(chunks.DERIVATIONS, "rr", ("minus", "ret", "cfr"))
    monkeypatch.setitem(chunks.DERIVATIONS, "res_er", ("one_minus_known", "mkt_er", "sec_er"))
    monkeypatch.setitem(chunks.DERIVATIONS, "alias", ("same", "ret"))
    fields = _fields()
    arrays, _stats = chunks.write_arrays(tmp_path, fields, GRID)
    assert set(arrays["derived"]) == {"rr", "res_er", "alias"}
    codes = arrays["chunks"]
    assert set("".join(codes["count"])) == {"B", "H"} and "f" in "".join(codes["rank"])
    assert chunks.GROUPED in "".join(codes["rank"]) and set("".join(codes["never"])) == {"."}
    return chunks.open_arrays(tmp_path, arrays)


def test_the_assembled_row_holds_stored_then_derived_fields_bitwise(
    opened: dict[str, chunks.FieldArray],
) -> None:
    fields = _fields()
    store = opened["ret"].store  # type: ignore[attr-defined]
    assert store.fields[: len(store.names)] == store.names
    assert store.fields[len(store.names) :] == ["res_er", "rr"]  # the alias is ret's row
    assert store.position["alias"] == store.position["ret"]
    assert "never" not in store.position
    for r in range(GRID.n):
        row = store.full_row(r)
        assert not row.flags.writeable
        for name in store.fields:
            _same(row[store.position[name]], fields[name][r])
    # Rows assembled into recycled memory (garbage in it first) are the same.
    out = np.full((len(store.fields), GRID.t), 7.0)
    for r in reversed(range(GRID.n)):
        _same(store.full_row(r, out), np.stack([fields[n][r] for n in store.fields]))


def test_long_reads_of_derived_and_never_stored_fields_are_views(
    opened: dict[str, chunks.FieldArray],
) -> None:
    fields = _fields()
    store = opened["ret"].store  # type: ignore[attr-defined]
    for r in range(GRID.n):
        for name in ("rr", "res_er", "alias", "never", "count", "rank"):
            got = opened[name][r, 3:61]
            _same(got, fields[name][r, 3:61])
            assert not got.flags.owndata and not got.flags.writeable
        # Short reads (two chunks at most) compute from the sources' runs: same bits.
        for name in ("rr", "res_er", "alias", "never"):
            _same(opened[name][r, 9:20], fields[name][r, 9:20])
    assert np.shares_memory(opened["never"][0, 0:61], store.nan_row)
    # Every other index form of a derived field computes it: same bits as the dense array.
    _same(np.asarray(opened["res_er"]), fields["res_er"])
    _same(opened["rr"][[1, 5, 12], [0, 30, 60]], fields["rr"][[1, 5, 12], [0, 30, 60]])


def test_the_kernel_reads_its_chunks_at_their_addresses_only_when_contiguous() -> None:
    arr = np.arange(12.0).reshape(3, 4)
    assert row_kernel.address(arr) == arr.ctypes.data
    assert row_kernel.address(np.empty((0, 4))) == 0
    with pytest.raises(ValueError, match="C-contiguous"):
        row_kernel.address(arr[:, ::2])


def test_the_warm_up_runs_the_kernel() -> None:
    row_kernel.warm_up()  # raises if the copy is wrong
