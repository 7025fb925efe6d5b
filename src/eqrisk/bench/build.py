"""`eqrisk bench build`: what a version costs on disk and what reading one ticker costs, on a
synthetic universe (5,000 symbols x 7,560 sessions by default), in one run:

- the disk of a full version written by the snapshot writer (chunked arrays + the long table),
- the disk a rebuild with one more session adds (bytes of the files it did not share),
- the per-ticker full-history read of every field a `/api/ticker-returns` or `/daily` answer
  reads, from the chunked version and from monolithic memory-mapped `.npy` files of the same
  values (today's layout before chunking), and from Zarr v3 when it is installed.

The synthetic fields have the shapes of a real build's: listing dates spread over the history
(NaN before), the model's warm-up, a subsector level for a third of the stocks, integer counts,
and the fields a build derives (`beta_mkt = l1_mkt_hr`, `l1_rr = return - l1_cfr`, ...) so that
the writer derives them as it would. Values are a counter-based hash of (field, row, session),
so any block is computed on demand (memory stays bounded by one block) and a version with one
more session has the very same earlier values. Sections are plain functions of `BuildBench`;
the model section (`bench.incremental`) runs the real build on a synthetic market: a full
build, a one-session incremental build and the full build on a Dask LocalCluster, with their
peak memory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.snapshot import chunks, tables

WARMUP = 126  # sessions before the model publishes (min_obs)
# Every array a `/api/ticker-returns` (all columns) or `/daily` (all fields) answer reads.
READ_FIELDS = (
    "return", "log_return", "price_close",
    "l3_mkt_hr", "l3_sec_hr", "l3_sub_hr", "l3_mkt_er", "l3_sec_er", "l3_sub_er", "l3_res_er",
    "l1_mkt_hr", "l1_mkt_er", "l1_res_er",
    "l2_mkt_hr", "l2_sec_hr", "l2_mkt_er", "l2_sec_er", "l2_res_er",
    "l1_cfr", "l1_rr", "l2_cfr", "l2_rr", "l3_cfr", "l3_rr", "l1_hq", "l2_hq", "l3_hq",
    "open", "high", "low", "close_raw", "volume", "market_cap", "turnover",
)  # fmt: skip
MODEL_FIELDS = (
    "l1_mkt_hr", "l1_mkt_er", "l2_mkt_hr", "l2_sec_hr", "l2_mkt_er", "l2_sec_er", "l2_res_er",
    "l3_mkt_hr", "l3_sec_hr", "l3_mkt_er", "l3_sec_er", "l3_res_er", "l1_cfr", "l2_cfr",
    "l3_cfr", "l1_hq", "l2_hq", "l3_hq", "resid_return", "vol_252d_ann",
)  # fmt: skip
SUBSECTOR_FIELDS = ("l3_sub_hr", "l3_sub_er")
PRICE_FIELDS = ("return", "log_return", "price_close", "open", "high", "low", "close_raw",
                "market_cap", "turnover", "vol_23d")  # fmt: skip
# The synthetic fields that the writer should find derivable: exactly its own rules.
DERIVED = chunks.DERIVATIONS


@dataclass(frozen=True)
class BuildBench:
    symbols: int = 5000
    sessions: int = 7560
    reads: int = 200  # tickers whose full history is read per layout
    chunk: int = chunks.CHUNK_SESSIONS
    block: int = chunks.BLOCK_SYMBOLS
    zarr_fields: int = 3  # fields written to Zarr for its read timing (0: skip Zarr)
    seed: int = 0
    folder: Path | None = None  # where to write (a temporary folder by default)
    model: bool = True  # the model section: full and one-session incremental build
    model_check: bool = False  # and a full rebuild compared bitwise with the incremental one


def _hash01(seed: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) values, a pure function of (seed, row, session): splitmix64."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)) ^ (
            rows.astype(np.uint64)[:, None] * np.uint64(1 << 20) + cols.astype(np.uint64)[None, :]
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class SyntheticField:
    """One (n x T) field, any block computed on demand (see the module docstring)."""

    def __init__(self, name: str, shape: tuple[int, int], first: np.ndarray, sub: np.ndarray):
        self.name, self.shape, self.first, self.sub = name, shape, first, sub
        self.seed = sum(ord(ch) * 131**i for i, ch in enumerate(name)) % (1 << 31)

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows = np.arange(self.shape[0])[key[0]]
        cols = np.arange(self.shape[1])[key[1]]
        age = cols[None, :] - self.first[rows][:, None]  # sessions since listing
        u = _hash01(self.seed, rows, cols)
        name = self.name
        if name == "n_obs":
            counts: np.ndarray = np.clip(age, 0, 252).astype(np.float64)
            return counts
        if name == "mktcap_rank":
            values = np.floor(u * 5000) + 1
        elif name == "volume":
            values = np.floor(u * 5e7)
        else:
            values = 1.0 + (u - 0.5) * (0.2 if name in PRICE_FIELDS else 1.0)
        live = age >= (WARMUP if name in MODEL_FIELDS or name in SUBSECTOR_FIELDS else 0)
        if name in SUBSECTOR_FIELDS:
            live &= self.sub[rows][:, None]
        return np.where(live, values, np.nan)


class DerivedField:
    """A field computed from others as the model computes it (so the writer derives it)."""

    def __init__(self, op: str, sources: list[SyntheticField]):
        self.op, self.sources, self.shape = op, sources, sources[0].shape

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        out: np.ndarray = np.asarray(chunks.derive(self.op, [s[key] for s in self.sources]))
        return out


def synthetic_fields(n: int, t: int, seed: int, horizon: int) -> dict[str, chunks.Sliceable]:
    """The fields of a build over n symbols x t sessions (the same names as a real build);
    listing dates are drawn over `horizon` sessions, so that they do not depend on t."""
    rng = np.random.default_rng(seed)
    first = np.where(rng.random(n) < 0.6, 0, rng.integers(0, max(1, horizon), n))
    sub = rng.random(n) < 1 / 3
    names = {*READ_FIELDS, *MODEL_FIELDS, "n_obs", "vol_23d", "mktcap_rank", "beta_mkt",
             "beta_sec", "resid_return"}  # fmt: skip
    base = {m: SyntheticField(m, (n, t), first, sub) for m in sorted(names) if m not in DERIVED}
    fields: dict[str, chunks.Sliceable] = dict(base)
    for name, (op, *sources) in DERIVED.items():
        fields[name] = DerivedField(op, [base[s] for s in sources])
    return fields


def write_version(
    folder: Path,
    fields: Mapping[str, chunks.Sliceable],
    grid: chunks.ChunkGrid,
    previous: Path | None,
) -> tuple[dict[str, Any], chunks.WriteStats]:
    """What `write_content` writes for the arrays and the long table (the same functions: the
    monthly files; the daily rows are the arrays')."""
    folder.mkdir(parents=True)
    arrays, stats = chunks.write_arrays(folder, fields, grid, previous=previous)
    sessions = np.datetime64("1996-01-02") + np.arange(grid.t)  # calendar days: any dates do
    np.save(folder / "sessions.npy", sessions)
    symbols = [f"S{i:05d}" for i in range(grid.n)]
    history = tables.write_security_history(
        folder, fields, symbols, sessions, grid, previous=previous, stats=stats
    )
    manifest = {"arrays": arrays, "security_history": history, "storage": stats.describe()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest, stats


def disk_bytes(folder: Path, only_new: bool = False) -> int:
    """Bytes of a version's files (with only_new: those no other version links)."""
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and (not only_new or p.stat().st_nlink == 1)
    )


def _time_reads(
    read: Callable[[int], Any], rows: np.ndarray, reset: Callable[[], None] = lambda: None
) -> float:
    """Seconds per ticker: a warm-up pass (page cache, page tables), then the best of two;
    `reset` runs before each pass (each ticker is read once per pass, never from a cache)."""
    reset()
    for r in rows:
        read(int(r))
    best = float("inf")
    for _ in range(2):
        reset()
        start = time.perf_counter()
        for r in rows:
            read(int(r))
        best = min(best, (time.perf_counter() - start) / len(rows))
    return best


def _dense_files(
    folder: Path, values: Mapping[str, Any], names: Sequence[str], n: int, t: int
) -> dict[str, np.ndarray]:
    """`values` of `names` written as dense `.npy` files into `folder`, memory-mapped back:
    the layout the chunked one is timed against."""
    folder.mkdir(exist_ok=True)
    for name in names:
        np.save(folder / f"{name}.npy", np.asarray(values[name][0:n, 0:t], dtype=np.float64))
    return {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in names}


def _reads_vs_dense(
    mono: Mapping[str, np.ndarray],
    version: Mapping[str, Any],
    rows: np.ndarray,
    t: int,
    *,
    checked: int,
) -> tuple[float, float, bool]:
    """One ticker's full history of every field of `mono`, read from the dense files and from
    the chunked `version`: seconds per ticker of each, and whether the first `checked` rows
    read back identical."""
    names = list(mono)

    def read_mono(r: int) -> list[np.ndarray]:
        return [np.array(mono[f][r, 0:t]) for f in names]

    def read_version(r: int) -> list[np.ndarray]:
        return [np.asarray(version[f][r, 0:t]) for f in names]

    identical = all(
        chunks.same_bits(a, b)
        for r in rows[:checked]
        for a, b in zip(read_mono(int(r)), read_version(int(r)), strict=True)
    )
    mono_s = _time_reads(read_mono, rows)
    store = next(a for a in version.values() if isinstance(a, chunks.ChunkedArray)).store
    return mono_s, _time_reads(read_version, rows, store.forget), identical


def run(b: BuildBench, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="eqrisk-bench-build-", dir=b.folder))
    try:
        return _run(b, work, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(b: BuildBench, work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    n, t = b.symbols, b.sessions
    grid = chunks.ChunkGrid(n, t, b.block, b.chunk)
    fields = synthetic_fields(n, t, b.seed, t)
    say(f"writing a full version of {n} x {t}")
    start = time.perf_counter()
    first, stats = write_version(work / "v1", fields, grid, None)
    write_s = time.perf_counter() - start
    full = disk_bytes(work / "v1")
    arrays_bytes = disk_bytes(work / "v1" / "arrays")
    history_bytes = disk_bytes(work / "v1" / "security_history")

    say("writing the version with one more session")
    grown = chunks.ChunkGrid(n, t + 1, b.block, b.chunk)
    second, update = write_version(
        work / "v2", synthetic_fields(n, t + 1, b.seed, t), grown, work / "v1"
    )
    added = disk_bytes(work / "v2", only_new=True)
    # Per block: its group file (with its runs index) and each narrow field's file of the last
    # chunk; + this year's monthly file of the long table.
    table = second["arrays"]["chunks"]
    expected_rewrites = 1
    for blk in range(grown.blocks):
        last = [table[name][blk][-1] for name in table]
        expected_rewrites += (chunks.GROUPED in last) + sum(code in "BHf" for code in last)

    say(f"reading {b.reads} tickers' full history, {len(READ_FIELDS)} fields")
    rows = np.random.default_rng(b.seed + 1).choice(n, size=min(b.reads, n), replace=False)
    chunked = chunks.open_arrays(work / "v1", first["arrays"])
    mono = _dense_files(work / "monolithic", fields, READ_FIELDS, n, t)
    mono_s, chunked_s, identical = _reads_vs_dense(mono, chunked, rows, t, checked=20)
    result: dict[str, Any] = {
        "symbols": n,
        "sessions": t,
        "chunk_sessions": b.chunk,
        "block_symbols": b.block,
        "fields": len(fields),
        "fields_stored": len(first["arrays"]["chunks"]),
        "fields_derived": sorted(first["arrays"]["derived"]),
        "full_version_bytes": full,
        "full_version_mb": round(full / 1e6, 1),
        "arrays_mb": round(arrays_bytes / 1e6, 1),
        "security_history_mb": round(history_bytes / 1e6, 1),
        "chunks_written": stats.written,
        "chunks_empty": stats.empty,
        "write_s": round(write_s, 2),
        "update_added_bytes": added,
        "update_added_mb": round(added / 1e6, 3),
        "update_added_pct": round(100 * added / full, 3),
        "update_chunks_written": update.written,
        "update_chunks_expected": expected_rewrites,
        "update_chunks_shared": update.shared,
        "update_worst_case_pct": round(100 * min(1.0, b.chunk / (t + 1)), 3),
        "read_fields": len(READ_FIELDS),
        "read_us_per_ticker_monolithic_npy": round(mono_s * 1e6, 1),
        "read_us_per_ticker_chunked": round(chunked_s * 1e6, 1),
        "read_ratio_chunked_vs_monolithic": round(chunked_s / mono_s, 2),
        "read_us_per_field_monolithic_npy": round(mono_s / len(READ_FIELDS) * 1e6, 2),
        "read_us_per_field_chunked": round(chunked_s / len(READ_FIELDS) * 1e6, 2),
        "reads_identical": identical,
    }
    if b.zarr_fields:
        result.update(_zarr_reads(b, fields, grid, rows, work, mono))
    if b.model:
        from eqrisk.bench.incremental import run_model_builds

        result.update(
            run_model_builds(n, t, seed=b.seed, folder=work, check=b.model_check, say=say)
        )
    return result


def read_version(folder: Path, reads: int = 200, seed: int = 0) -> dict[str, Any]:
    """A built version (the real data set's, say): its disk, and one ticker's full history of
    every field of READ_FIELDS it has, read from it and from dense memory-mapped `.npy` files
    of the same values (written next to it in a temporary folder), in one run."""
    from eqrisk.snapshot.versions import Snapshot

    snap = Snapshot.open(folder)
    names = [f for f in READ_FIELDS if f in snap.manifest["fields"]]
    n, t = int(snap.manifest["universe_size"]), int(snap.manifest["sessions"])
    arrays = {name: snap.array(name) for name in names}
    rows = np.random.default_rng(seed + 1).choice(n, size=min(reads, n), replace=False)
    work = Path(tempfile.mkdtemp(prefix="eqrisk-bench-read-"))
    try:
        mono = _dense_files(work, arrays, names, n, t)
        mono_s, version_s, identical = _reads_vs_dense(mono, arrays, rows, t, checked=len(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "version": folder.name,
        "layout": snap.manifest["arrays"].get("layout", chunks.DENSE_GROUPS),
        "symbols": n,
        "sessions": t,
        "version_mb": round(disk_bytes(folder) / 1e6, 1),
        "arrays_mb": round(disk_bytes(folder / "arrays") / 1e6, 1),
        "security_history_mb": round(disk_bytes(folder / tables.HISTORY_DIR) / 1e6, 1),
        "read_fields": len(names),
        "read_us_per_ticker_monolithic_npy": round(mono_s * 1e6, 1),
        "read_us_per_ticker_version": round(version_s * 1e6, 1),
        "read_ratio_version_vs_monolithic": round(version_s / mono_s, 2),
        "reads_identical": identical,
    }


def _zarr_reads(
    b: BuildBench,
    fields: Mapping[str, chunks.Sliceable],
    grid: chunks.ChunkGrid,
    rows: np.ndarray,
    work: Path,
    mono: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """Per-field read time from Zarr v3 arrays on the same grid, compressed (Zarr's default
    codec, zstd) and uncompressed, next to the two layouts above on the same fields."""
    try:
        import zarr
    except ImportError:
        return {"zarr": "not installed (pip install 'zarr>=3,<4' to measure it)"}
    names = list(READ_FIELDS[: b.zarr_fields])
    out: dict[str, Any] = {"zarr_version": zarr.__version__, "zarr_fields": len(names)}
    t = grid.t
    for label, compressed in (("zarr_zstd", True), ("zarr_raw", False)):
        arrays = {}
        for name in names:
            arr = zarr.create_array(
                store=str(work / label / name),
                shape=(grid.n, t),
                chunks=(grid.block, grid.chunk),
                dtype="float64",
                compressors="auto" if compressed else None,
                fill_value=np.nan,
            )
            arr[:, :] = np.asarray(mono[name])
            arrays[name] = arr

        def read(r: int, arrays: dict[str, Any] = arrays) -> list[np.ndarray]:
            return [np.asarray(arrays[f][r, 0:t]) for f in names]

        identical = all(
            chunks.same_bits(got, np.asarray(mono[f][int(r), 0:t]))
            for r in rows[:5]
            for f, got in zip(names, read(int(r)), strict=True)
        )
        out["zarr_reads_identical"] = out.get("zarr_reads_identical", True) and identical
        seconds = _time_reads(read, rows[: max(5, len(rows) // 10)])
        out[f"read_us_per_field_{label}"] = round(seconds / len(names) * 1e6, 1)
        out[f"{label}_bytes"] = disk_bytes(work / label)
    return out
