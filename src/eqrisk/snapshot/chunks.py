"""Chunked arrays of a snapshot version: immutable files that consecutive versions share.

Each (n x T) metric is cut along a grid of symbol blocks x time chunks, rows [b*S, (b+1)*S) x
sessions [c*L, (c+1)*L), into files:

    arrays/_rows/<b>.<c>.npy       (runs x L) float64: the chunk of every float64 field, one
                                   run of L sessions per (row, field) that holds a number, a
                                   row's runs side by side (a ticker's history: one piece a chunk)
    arrays/_rows/<b>.<c>.runs.npy  (rows x fields) int32: where each (row, field) run is in the
                                   group file, -1 where it is all NaN (not stored)
    arrays/<field>/<b>.<c>.npy     (rows x L): the chunk of a field stored in a narrower dtype

with fixed boundaries at multiples of S and L, so that a new session changes only the last
time chunk of each block (the last chunk holds only the sessions that exist: it grows), and a
worker that computed one symbol block writes that block's files alone. Why these choices, and
the measurements behind them, are in docs/decisions/snapshots.md.

- A chunk whose values are all NaN is not stored (the manifest says so; it reads back as NaN),
  nor is the run of a row that is all NaN within a group file (its runs index says -1).
- A chunk is stored in the narrowest of uint8, uint16, float32 and float64 that gives back the
  same float64 bits, so counts (n_obs) take a byte and floats stay exact.
- A field that is an exact function of stored ones (an alias, `a - b`, `1 - a`, `1 - a - b`
  skipping NaN terms: IEEE operations that give the same bits on every machine) is not stored when the writer has checked, on the
  whole array, that the function gives its very bits back.
- A chunk equal, byte for byte, to the same chunk of the previous version is a hard link to that
  file, never written again: versions are whole folders that share inodes, so removing one (`rm
  -r`, pruning) frees only what no other version links.

Readers get a `ChunkedArray`, sliced like the dense array it replaces (`a[row, lo:hi]`,
`a[:, -1]`, `a[rows, cols]`), over memory-mapped chunks opened on first use.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from eqrisk.snapshot import row_kernel

LAYOUT = "chunks-2"  # group files hold only the runs with a number (`runs_path`)
DENSE_GROUPS = "chunks-1"  # the layout before: group files (rows x fields x L), every run
CHUNK_SESSIONS = 128  # L: a one-session update rewrites at most L/T of a version
BLOCK_SYMBOLS = 1024  # S: the rows one worker writes as a unit
EMPTY = "."  # manifest code of a chunk that is not stored (all NaN)
GROUPED = "d"  # float64 chunks: stored together, a row's fields contiguous (`group_path`)
GROUP_DIR = "_rows"
ROW_CACHE_BYTES = 8 << 20  # assembled rows kept per version (why so few: ChunkStore.cached_row)
CODES: dict[str, np.dtype[Any]] = {
    "B": np.dtype(np.uint8),
    "H": np.dtype(np.uint16),
    "f": np.dtype(np.float32),
    "d": np.dtype(np.float64),
}
CODE_OF = {dtype: code for code, dtype in CODES.items()}
RUNS = "i"  # the dtype code of a group's runs index (`runs_path`)
FILE_DTYPES: dict[str, np.dtype[Any]] = {**CODES, RUNS: np.dtype(np.int32)}

# Fields that are exact functions of others: (operation, source fields). Stored anyway when the
# writer finds a single differing bit.
DERIVATIONS: dict[str, tuple[str, ...]] = {
    "beta_mkt": ("same", "l1_mkt_hr"),
    "beta_sec": ("same", "l2_sec_hr"),
    "l1_rr": ("minus", "return", "l1_cfr"),
    "l2_rr": ("minus", "return", "l2_cfr"),
    "l3_rr": ("minus", "return", "l3_cfr"),
    "l1_res_er": ("one_minus", "l1_mkt_er"),
    # The cascade's `1.0 - er_m - er_s [- er_u]`, left to right; a row without the deeper
    # level (an ETF: L1 carried into the L2/L3 columns, its sector share NaN) stops earlier.
    "l2_res_er": ("one_minus_known", "l2_mkt_er", "l2_sec_er"),
    "l3_res_er": ("one_minus_known", "l3_mkt_er", "l3_sec_er", "l3_sub_er"),
}


class Sliceable(Protocol):
    """What the writer reads a field from: a dense array, a memory map or a lazy generator."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: Any, /) -> Any: ...


class FieldArray(Protocol):
    """What `Snapshot.array` returns: an (n x T) float64 array for indexing and `np.asarray`."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: Any, /) -> Any: ...


@dataclass(frozen=True)
class ChunkGrid:
    """The fixed grid of one version: n symbols x t sessions in blocks of S and chunks of L."""

    n: int
    t: int
    block: int = BLOCK_SYMBOLS
    chunk: int = CHUNK_SESSIONS

    @property
    def blocks(self) -> int:
        return -(-self.n // self.block)

    @property
    def chunks(self) -> int:
        return -(-self.t // self.chunk)

    def rows(self, b: int) -> tuple[int, int]:
        return b * self.block, min(self.n, (b + 1) * self.block)

    def cols(self, c: int) -> tuple[int, int]:
        return c * self.chunk, min(self.t, (c + 1) * self.chunk)

    def cells(self) -> Iterator[tuple[int, int]]:
        for b in range(self.blocks):
            for c in range(self.chunks):
                yield b, c

    def describe(self) -> dict[str, int]:
        return {"symbols": self.n, "sessions": self.t, "block": self.block, "chunk": self.chunk}

    @classmethod
    def of(cls, grid: Mapping[str, Any]) -> ChunkGrid:
        return cls(
            int(grid["symbols"]), int(grid["sessions"]), int(grid["block"]), int(grid["chunk"])
        )


# Fields a row often lacks (a level the symbol does not have: an ETF's sector, most stocks'
# subsector), last in a group file and in an assembled row, the deepest last: a row without
# them is then one contiguous piece and one NaN fill per chunk.
SPARSE_LAST = ("l2_sec_er", "l2_sec_hr", "l3_sec_er", "l3_sec_hr", "l3_sub_er", "l3_sub_hr")


def group_order(name: str) -> tuple[int, str]:
    """Order of the fields in a group file (layout chunks-2; chunks-1: alphabetical)."""
    return (SPARSE_LAST.index(name) + 1 if name in SPARSE_LAST else 0, name)


def chunk_path(name: str, b: int, c: int) -> Path:
    """Path of one field's own chunk file (a narrow dtype) inside a version folder."""
    return Path("arrays") / name / f"{b}.{c}.npy"


def group_path(b: int, c: int) -> Path:
    """Path of the group file of (block b, chunk c): its float64 fields, (rows x fields x L)."""
    return Path("arrays") / GROUP_DIR / f"{b}.{c}.npy"


def runs_path(b: int, c: int) -> Path:
    """Path of the runs index of group file (b, c): (rows x fields) int32, -1 = not stored."""
    return Path("arrays") / GROUP_DIR / f"{b}.{c}.runs.npy"


def group_runs(stacked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (rows x fields x L) group as (runs x L) float64, the runs holding a number in
    row-major order, and the (rows x fields) int32 index of each run (-1: all NaN)."""
    kept = ~np.isnan(stacked).all(axis=2)
    index = np.full(kept.shape, -1, dtype=np.int32)
    index[kept] = np.arange(int(kept.sum()), dtype=np.int32)
    return np.ascontiguousarray(stacked[kept]), index


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def narrowest(values: np.ndarray) -> np.ndarray:
    """`values` (float64) in the narrowest dtype that converts back to the same bits."""
    for code in ("B", "H", "f"):
        dtype = CODES[code]
        if dtype.kind == "u" and not np.isfinite(values).all():
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            narrow = values.astype(dtype)
        if _same_bits(narrow.astype(np.float64), values):
            return narrow
    return values


@dataclass
class WriteStats:
    """What a write did: chunk files written anew, linked from the previous version, left out
    (all NaN), fields derived, and the bytes of the new files."""

    written: int = 0
    shared: int = 0
    empty: int = 0
    bytes_written: int = 0
    derived: list[str] = field(default_factory=list)
    written_files: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "chunks_written": self.written,
            "chunks_shared": self.shared,
            "chunks_empty": self.empty,
            "bytes_written": self.bytes_written,
        }


def share_or_write(
    folder: Path,
    rel: Path,
    previous: Path | None,
    same: Callable[[Path], bool],
    write: Callable[[Path], None],
) -> bool:
    """Create `folder/rel`: a hard link to `previous/rel` when `same` says that file holds the
    content already, else `write` it. Returns True when linked."""
    target = folder / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if previous is not None:
        old = previous / rel
        if old.is_file() and same(old):
            try:
                os.link(old, target)
                return True
            except OSError as exc:  # another filesystem, or one without hard links
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
    write(target)
    return False


def link_unread(folder: Path, rel: Path, previous: Path) -> None:
    """Create `folder/rel` as a hard link to `previous/rel` without reading it: an incremental
    build has proved (by its inputs' digests) that the file holds what a rebuild would write.
    Copied where the filesystem has no hard links."""
    target = folder / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(previous / rel, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(previous / rel, target)


def _chunk_equals(stored: np.ndarray) -> Callable[[Path], bool]:
    def same(old: Path) -> bool:
        try:
            previous = np.load(old, mmap_mode="r")
        except (ValueError, OSError):
            return False  # damaged or unreadable: never linked
        return _same_bits(np.asarray(previous), stored)

    return same


def _saver(values: np.ndarray) -> Callable[[Path], None]:
    def save(path: Path) -> None:
        np.save(path, values)

    return save


def write_block(
    folder: Path,
    fields: Mapping[str, Sliceable],
    grid: ChunkGrid,
    b: int,
    *,
    previous: Path | None = None,
    stats: WriteStats | None = None,
    reuse: int = 0,
    previous_codes: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Write the chunks of symbol block b of every field: per time chunk, the float64 fields
    together in one row-major group file, the others (narrow dtypes) each in its own.

    With `reuse` = c0 (an incremental build), the chunks c < c0 are hard links to the files of
    the `previous` version, whose block-b codes `previous_codes` gives, never read: the fields
    read only from chunk c0 on.

    A worker that computed block b calls this alone. Returns, per field, the block's code
    string: one character per chunk, `EMPTY` or the stored dtype ('d': in the group)."""
    stats = stats if stats is not None else WriteStats()
    names = sorted(fields, key=group_order)
    codes: dict[str, list[str]] = {name: [] for name in names}
    r0, r1 = grid.rows(b)
    if reuse:
        if previous is None or previous_codes is None or set(previous_codes) != set(names):
            raise ValueError("reusing chunks needs the previous version's codes of every field")
        for c in range(reuse):
            grouped = False
            for name in names:
                code = previous_codes[name][c]
                codes[name].append(code)
                if code == EMPTY:
                    stats.empty += 1
                elif code == GROUPED:
                    grouped = True
                else:
                    link_unread(folder, chunk_path(name, b, c), previous)
                    stats.shared += 1
            if grouped:
                link_unread(folder, group_path(b, c), previous)
                link_unread(folder, runs_path(b, c), previous)
                stats.shared += 1
    for c in range(reuse, grid.chunks):
        c0, c1 = grid.cols(c)
        group: list[np.ndarray] = []
        for name in names:
            block = np.ascontiguousarray(fields[name][r0:r1, c0:c1], dtype=np.float64)
            if np.isnan(block).all():
                stats.empty += 1
                codes[name].append(EMPTY)
                continue
            stored = narrowest(block)
            code = CODE_OF[stored.dtype]
            codes[name].append(code)
            if code == GROUPED:
                group.append(block)
            else:
                _store(folder, chunk_path(name, b, c), stored, previous, stats)
        if group:
            data, index = group_runs(np.stack(group, axis=1))
            _store_group(folder, b, c, data, index, previous, stats)
    return {name: "".join(line) for name, line in codes.items()}


def _store(
    folder: Path, rel: Path, stored: np.ndarray, previous: Path | None, stats: WriteStats
) -> None:
    if share_or_write(folder, rel, previous, _chunk_equals(stored), _saver(stored)):
        stats.shared += 1
    else:
        stats.written += 1
        stats.bytes_written += (folder / rel).stat().st_size
        stats.written_files.append(str(rel))


def _store_group(
    folder: Path,
    b: int,
    c: int,
    data: np.ndarray,
    index: np.ndarray,
    previous: Path | None,
    stats: WriteStats,
) -> None:
    """A group file and its runs index: one chunk in the stats (written when either file is)."""
    linked = [
        share_or_write(folder, rel, previous, _chunk_equals(values), _saver(values))
        for rel, values in ((group_path(b, c), data), (runs_path(b, c), index))
    ]
    if all(linked):
        stats.shared += 1
        return
    stats.written += 1
    for rel, was_linked in zip((group_path(b, c), runs_path(b, c)), linked, strict=True):
        if not was_linked:
            stats.bytes_written += (folder / rel).stat().st_size
            stats.written_files.append(str(rel))


def derive(op: str, sources: list[Any]) -> Any:
    """Apply one derivation to values read from its sources (arrays or scalars)."""
    if op == "same":
        return sources[0]
    if op == "minus":
        return np.subtract(sources[0], sources[1])
    if op == "one_minus":
        return np.subtract(1.0, sources[0])
    if op == "one_minus_known":
        out = np.subtract(1.0, sources[0])
        for more in sources[1:]:
            # `more == more` is False where NaN: there the level is absent, nothing subtracted.
            out = np.subtract(out, more, out=np.asarray(out), where=np.equal(more, more))
        return out[()] if np.ndim(out) == 0 else out  # one value stays a scalar
    raise ValueError(f"unknown derivation {op!r}")


def derivable(name: str, fields: Mapping[str, Sliceable], grid: ChunkGrid) -> bool:
    """True when DERIVATIONS[name] gives back every bit of `fields[name]` (checked per block)."""
    rule = DERIVATIONS.get(name)
    if rule is None or not all(s in fields and s not in DERIVATIONS for s in rule[1:]):
        return False
    op, *sources = rule
    for b in range(grid.blocks):
        r0, r1 = grid.rows(b)
        want = np.ascontiguousarray(fields[name][r0:r1, :], dtype=np.float64)
        with np.errstate(all="ignore"):
            got = derive(op, [np.asarray(fields[s][r0:r1, :], dtype=np.float64) for s in sources])
        if not _same_bits(np.ascontiguousarray(got, dtype=np.float64), want):
            return False
    return True


def derivable_from(name: str, fields: Mapping[str, Sliceable], grid: ChunkGrid, lo: int) -> bool:
    """True when DERIVATIONS[name] gives back every bit of `fields[name]` from session `lo` on
    (an incremental build's new sessions; the earlier ones were checked when written)."""
    rule = DERIVATIONS.get(name)
    if rule is None:
        return False
    op, *sources = rule
    for b in range(grid.blocks):
        r0, r1 = grid.rows(b)
        want = np.ascontiguousarray(fields[name][r0:r1, lo:], dtype=np.float64)
        with np.errstate(all="ignore"):
            got = derive(op, [np.asarray(fields[s][r0:r1, lo:], dtype=np.float64) for s in sources])
        if not _same_bits(np.ascontiguousarray(got, dtype=np.float64), want):
            return False
    return True


def write_arrays(
    folder: Path,
    fields: Mapping[str, Sliceable],
    grid: ChunkGrid,
    *,
    previous: Path | None = None,
    progress: Callable[[str], None] | None = None,
    reuse: int = 0,
    previous_arrays: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], WriteStats]:
    """Write every field as chunks; returns the manifest's `arrays` block and the stats.

    With `reuse` = c0 > 0, chunks c < c0 are linked unread from `previous` (whose manifest
    block is `previous_arrays`), and the fields derived there are derived here (the caller
    has checked that they still are, from chunk c0 on: `derivable_from`)."""
    stats = WriteStats()
    derived: dict[str, list[str]] = {}
    if reuse:
        if previous_arrays is None:
            raise ValueError("reusing chunks needs the previous version's `arrays` block")
        derived = {name: list(rule) for name, rule in previous_arrays["derived"].items()}
        stats.derived.extend(sorted(derived))
    else:
        for name in sorted(fields):
            if derivable(name, fields, grid):
                derived[name] = list(DERIVATIONS[name])
                stats.derived.append(name)
    stored = {name: values for name, values in fields.items() if name not in derived}
    chunks: dict[str, list[str]] = {name: [] for name in sorted(stored)}
    for b in range(grid.blocks):
        old = None
        if reuse and previous_arrays is not None:
            old = {name: previous_arrays["chunks"][name][b] for name in previous_arrays["chunks"]}
        for name, line in write_block(
            folder, stored, grid, b, previous=previous, stats=stats, reuse=reuse, previous_codes=old
        ).items():
            chunks[name].append(line)
        if progress:
            progress(f"arrays: block {b + 1}/{grid.blocks}")
    return {"layout": LAYOUT, "grid": grid.describe(), "chunks": chunks, "derived": derived}, stats


# ------------------------------------------------------------------------------------- reading


def _index(key: Any, size: int) -> int | slice | np.ndarray:
    """One axis of an index: an int (checked, non-negative), a slice, or an int array."""
    if isinstance(key, slice):
        return key
    if isinstance(key, (int, np.integer)):
        i = int(key)
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for axis with size {size}")
        return i % size
    arr = np.asarray(key)
    if arr.dtype == bool:
        return np.flatnonzero(arr)
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < -size or arr.max() >= size):
        raise IndexError(f"index out of bounds for axis with size {size}")
    return arr % size


_KERNEL_OPS = {
    "minus": row_kernel.MINUS,
    "one_minus": row_kernel.ONE_MINUS,
    "one_minus_known": row_kernel.ONE_MINUS_KNOWN,
}


def _row_span(key: Any, n: int, t: int) -> tuple[int, int, int] | None:
    """(row, lo, hi) when `key` is the per-ticker read `[row, lo:hi]` (an int row in range, a
    step-less slice of sessions), else None: the fast path of every field's indexing."""
    if type(key) is tuple and len(key) == 2:
        r, cols = key
        if type(r) is int and type(cols) is slice and cols.step is None and 0 <= r < n:
            lo, hi, _ = cols.indices(t)
            return r, lo, hi
    return None


Copy = tuple[int, int, int]  # rows [lo, hi) of an assembled row <- runs from `off` (-1: NaN)


@dataclass(frozen=True)
class _Cell:
    """What chunk (b, c) of a version holds, opened once: the group's runs (`data`, (runs x L))
    and their index (`runs`, (rows x members)), each field's column in `runs` (`slot`), and
    how a row of it lands in an assembled row: the row's first run (`first`) and its pattern
    (`pattern`: which members have a run) whose copies (`copies`) move stretches of
    consecutive runs as slices (a stretch of fields without a run, or not stored, is one NaN
    fill); the fields stored on their own in this chunk: (position, array)."""

    width: int
    data: np.ndarray | None
    runs: np.ndarray | None
    slot: dict[int, int]
    first: np.ndarray
    pattern: np.ndarray
    copies: list[list[Copy]]
    own: list[tuple[int, np.ndarray]]


def _copies(kinds: list[tuple[int, int]]) -> list[Copy]:
    """Merge per-position sources ((position, run offset or -1 for NaN), positions ascending)
    into slices: consecutive positions with consecutive offsets (or both NaN) are one copy."""
    out: list[Copy] = []
    for pos, off in kinds:
        if out:
            lo, hi, first = out[-1]
            nan_after_nan = off < 0 and first < 0
            run_after_run = off >= 0 and first >= 0 and off == first + hi - lo
            if pos == hi and (nan_after_nan or run_after_run):
                out[-1] = (lo, hi + 1, first)
                continue
        out.append((pos, pos + 1, off))
    return out


class ChunkStore:
    """The stored chunks of one version: opened on first use, and the assembled rows.

    An answer reads several fields of a row (a ticker's answer: 27; Service A: the price and
    the fields asked); assembling every stored field of that row at once reads one contiguous
    piece per chunk (a row's runs in the group file) instead of one per field and chunk. So a
    read spanning more than two chunks assembles the whole row, the derived fields computed
    into it too (`fields`: stored, then derived; one compiled call, `row_kernel`), and keeps
    it for the next fields (first in, first out, ROW_CACHE_BYTES at most); short reads take
    the field's own runs.

    Reads both layouts: `chunks-2` (group files of the runs that hold a number, and their
    index) and `chunks-1` (group files of every run, read as if indexed in order)."""

    def __init__(
        self,
        folder: Path,
        grid: ChunkGrid,
        codes: Mapping[str, list[str]],
        layout: str = LAYOUT,
        derived: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if layout not in (LAYOUT, DENSE_GROUPS):
            raise ValueError(f"unknown chunk layout {layout!r}")
        self.folder, self.grid, self.codes, self.layout = folder, grid, codes, layout

        # Rows of an assembled row: the fields stored only in group files first (so that a
        # group lands in one contiguous run of rows), then the others; in group order within.
        def only_grouped(name: str) -> bool:
            return set("".join(codes[name])) - {EMPTY} == {GROUPED}

        # Fields never stored (all NaN) have no row in it.
        stored = [n for n in codes if set("".join(codes[n])) != {EMPTY}]
        order: Callable[[str], Any] = group_order if layout == LAYOUT else str  # chunks-1: a-z
        self._order = order
        self.names = sorted(stored, key=lambda n: (not only_grouped(n), order(n)))
        self.position = {name: i for i, name in enumerate(self.names)}
        # Then the derived fields, computed once per assembly (an alias is its source's row).
        self.fields = list(self.names)
        table: list[tuple[int, ...]] = []
        for name, (op, *sources) in sorted((derived or {}).items()):
            at = [self.position.get(s, -1) for s in sources]
            if op == "same":
                if at[0] >= 0:
                    self.position[name] = at[0]
                continue
            self.position[name] = len(self.fields)
            self.fields.append(name)
            table.append((_KERNEL_OPS[op], len(self.fields) - 1, *at, *[-1] * (3 - len(at))))
        self._derive_table = np.array(table, dtype=np.int64).reshape(-1, 5)
        self._files: dict[Path, np.ndarray] = {}
        self._cells: dict[tuple[int, int], _Cell] = {}
        self._plans: dict[int, tuple[Any, ...]] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._spare: list[np.ndarray] = []  # evicted rows' memory, for the next (`_recycle`)
        self._lock = threading.Lock()
        self._local = threading.local()
        row_bytes = max(1, len(self.fields) * grid.t * 8)
        self._keep = max(2, ROW_CACHE_BYTES // row_bytes)
        self.nan_row = np.full(grid.t, np.nan)  # what a field never stored reads as
        self.nan_row.flags.writeable = False

    def _file(self, rel: Path) -> np.ndarray:
        arr = self._files.get(rel)
        if arr is None:
            arr = np.asarray(np.load(self.folder / rel, mmap_mode="r"))
            self._files[rel] = arr
        return arr

    def cell(self, b: int, c: int) -> _Cell:
        """Chunk (b, c), opened once (see `_Cell`)."""
        found = self._cells.get((b, c))
        if found is None:
            found = self._open_cell(b, c)
            self._cells[b, c] = found
        return found

    def _open_cell(self, b: int, c: int) -> _Cell:
        c0, c1 = self.grid.cols(c)
        r0, r1 = self.grid.rows(b)
        # Group file order: as the writer stacked them.
        grouped = [n for n in sorted(self.codes, key=self._order) if self.codes[n][b][c] == GROUPED]
        slot = {self.position[n]: j for j, n in enumerate(grouped)}
        data = runs = None
        present = np.zeros((r1 - r0, 0), dtype=bool)
        first = np.zeros(r1 - r0, dtype=np.int64)
        if grouped:
            data = self._file(group_path(b, c))
            if self.layout == DENSE_GROUPS:  # every run stored, in row-major order
                rows, k, width = data.shape
                data = data.reshape(rows * k, width)
                runs = np.arange(rows * k, dtype=np.int32).reshape(rows, k)
            else:
                runs = np.array(self._file(runs_path(b, c)))
            present = runs >= 0
            # A row's runs are consecutive in member order: its first one is its least.
            first = np.where(present, runs, np.iinfo(np.int32).max).min(axis=1)
            first = np.where(present.any(axis=1), first, 0).astype(np.int64)
        kinds, pattern = np.unique(present, axis=0, return_inverse=True)
        copies = []
        for kind in kinds:
            # A row's runs are in group-file order (its members that have one): a member's
            # run is the count of the row's runs before it. Group order is not always the
            # assembled row's order (a field grouped in some chunks only comes later there).
            offset = np.cumsum(kind) - 1
            sources: list[tuple[int, int]] = []
            for i, name in enumerate(self.names):
                code = self.codes[name][b][c]
                if code not in (EMPTY, GROUPED):
                    continue  # copied from its own chunk
                if code == GROUPED and kind[slot[i]]:
                    sources.append((i, int(offset[slot[i]])))
                else:
                    sources.append((i, -1))
            copies.append(_copies(sources))
        own = [
            (i, self._file(chunk_path(name, b, c)))
            for i, name in enumerate(self.names)
            if self.codes[name][b][c] not in (EMPTY, GROUPED)
        ]
        return _Cell(
            width=c1 - c0,
            data=data,
            runs=runs,
            slot=slot,
            first=first,
            pattern=np.asarray(pattern, dtype=np.int64).ravel(),
            copies=copies,
            own=own,
        )

    def run(self, name: str, b: int, c: int, local: int) -> np.ndarray | None:
        """Row `local` of block b of one field over chunk c (its stored dtype), None when not
        stored (all NaN). A ticker's latest metrics read one value of many fields this way."""
        code = self.codes[name][b][c]  # a field never stored has only EMPTY codes
        if code == EMPTY:
            return None
        if code != GROUPED:
            own: np.ndarray = self._file(chunk_path(name, b, c))[local]
            return own
        cell = self.cell(b, c)
        assert cell.runs is not None and cell.data is not None
        at = int(cell.runs[local, cell.slot[self.position[name]]])
        return None if at < 0 else cell.data[at]

    def dense(self, name: str, b: int, c: int) -> np.ndarray | None:
        """One field's (rows x L) chunk (its stored dtype; a grouped field's runs placed in a
        new NaN array); None when not stored (all NaN)."""
        code = self.codes[name][b][c]
        if code == EMPTY:
            return None
        if code != GROUPED:
            return self._file(chunk_path(name, b, c))
        cell = self.cell(b, c)
        assert cell.runs is not None and cell.data is not None
        at = cell.runs[:, cell.slot[self.position[name]]]
        out = np.full((len(at), cell.width), np.nan)
        kept = at >= 0
        out[kept] = cell.data[at[kept]]
        return out

    def is_long(self, lo: int, hi: int) -> bool:
        """Whether a read of sessions [lo, hi) of one row spans more than two chunks: a
        ticker's answer, which reads its other fields too, so the whole row is assembled."""
        L = self.grid.chunk
        return hi > lo and (hi - 1) // L - lo // L + 1 > 2

    def cached_row(self, r: int) -> np.ndarray:
        """The assembled (fields x T) row r: kept for the next fields of the same answer.

        The cache is small on purpose (ROW_CACHE_BYTES, a few rows): a row is assembled into
        the memory of the one evicted, and a small cache's is still in the CPU's cache where a
        large one's is not (64 MB measured 1.4x slower a read than 8 MB on the real data set,
        docs/decisions/snapshots.md, "Reading a row"). Whole answers are cached elsewhere (the
        render cache, the gate's replays)."""
        row = self._rows.get(r)  # a dict read is atomic: no lock on the hit path
        if row is None:
            with self._lock:
                spare = self._spare.pop() if self._spare else None
            row = self.full_row(r, spare)
            with self._lock:
                self._rows[r] = row
                while len(self._rows) > self._keep:  # first in, first out
                    self._recycle(self._rows.pop(next(iter(self._rows))))
        return row

    def _recycle(self, row: np.ndarray) -> None:
        """Keep an evicted row's memory for the next assembly when nothing else holds it (no
        view of it is alive: a view holds a reference to it): a fresh (fields x T) array is
        a fresh mapping whose every page faults on first write, which costs as much as the
        assembly (on this machine more: freed memory goes back to the host, docs/BENCHMARKS.md).
        As many as the cache holds are kept (after `forget`, a whole pass's worth), so memory
        stays within twice the cache's budget. Called under the lock."""
        if sys.getrefcount(row) <= 2 and len(self._spare) < self._keep:  # this frame + the call's
            self._spare.append(row)

    def forget(self) -> None:
        """Drop the assembled rows (a benchmark times reads, not this cache)."""
        with self._lock:
            while self._rows:
                self._recycle(self._rows.popitem()[1])

    def _block_plan(self, b: int) -> tuple[Any, ...]:
        """The tables `row_kernel.assemble` walks for a row of block b (built once)."""
        plan = self._plans.get(b)
        if plan is None:
            plan = self._make_plan(b)
            self._plans[b] = plan
        return plan

    def _make_plan(self, b: int) -> tuple[Any, ...]:
        g = self.grid
        cells = [self.cell(b, c) for c in range(g.chunks)]
        bounds = np.array([g.cols(c)[0] for c in range(g.chunks)] + [g.t], dtype=np.int64)
        # The kernel reads the chunk files at their addresses: the store keeps them open.
        groups = np.array(
            [
                (0, 0) if cell.data is None else (row_kernel.address(cell.data), len(cell.data))
                for cell in cells
            ],
            dtype=np.int64,
        ).reshape(-1, 2)
        first = np.stack([cell.first for cell in cells])
        pattern = np.stack([cell.pattern for cell in cells])
        most = max(len(cell.copies) for cell in cells)
        copy_at = np.zeros((g.chunks, most + 1), dtype=np.int64)
        table: list[Copy] = []
        for c, cell in enumerate(cells):
            for p, copies in enumerate(cell.copies):
                table.extend(copies)
                copy_at[c, p + 1 :] = len(table)
        own = [
            (c, i, row_kernel.OWN_DTYPES[arr.dtype], row_kernel.address(arr))
            for c, cell in enumerate(cells)
            for i, arr in cell.own
        ]
        return (
            bounds,
            groups,
            first,
            pattern,
            copy_at,
            np.array(table, dtype=np.int64).reshape(-1, 3),
            np.array(own, dtype=np.int64).reshape(-1, 4),
            np.searchsorted([c for c, *_ in own], np.arange(g.chunks + 1)).astype(np.int64),
            self._derive_table,
        )

    def full_row(self, r: int, out: np.ndarray | None = None) -> np.ndarray:
        """Every field of row r over all sessions, (fields x T) float64 in `fields` order
        (stored, then derived), read-only; written into `out` (a recycled row, no longer
        referenced) when given. One compiled call (`row_kernel.assemble`)."""
        b, local = divmod(r, self.grid.block)
        if out is None:
            out = np.empty((len(self.fields), self.grid.t))
        else:
            out.flags.writeable = True
        row_kernel.assemble(out, local, *self._scratch(), *self._block_plan(b))
        out.flags.writeable = False
        return out

    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        """This thread's scratch for `row_kernel.assemble`: room for a row's runs in one chunk
        (every stored field), and where each field's run is among them."""
        found: tuple[np.ndarray, np.ndarray] | None = getattr(self._local, "scratch", None)
        if found is None:
            n = max(1, len(self.names))
            found = (np.empty((n, self.grid.chunk)), np.empty(n, dtype=np.int64))
            self._local.scratch = found
        return found


class ChunkedArray:
    """One stored field of a chunked version, read as the dense (n x T) float64 array it was."""

    shape: tuple[int, int]
    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, store: ChunkStore, name: str) -> None:
        self.store, self.name, self.grid = store, name, store.grid
        self.shape = (store.grid.n, store.grid.t)
        self._position = store.position.get(name, -1)  # -1: never stored, all NaN

    def __len__(self) -> int:
        return self.grid.n

    def chunk(self, b: int, c: int) -> np.ndarray | None:
        """The (rows x L) chunk (its stored dtype), None when not stored (all NaN)."""
        return self.store.dense(self.name, b, c)

    def row(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of row r: the per-ticker read (from the assembled row when the
        store keeps it, else one copy of the runs it spans)."""
        if hi <= lo:
            return np.full(0, np.nan)
        if self.store.is_long(lo, hi):
            if self._position < 0:
                return self.store.nan_row[lo:hi]
            out: np.ndarray = self.store.cached_row(r)[self._position, lo:hi]
            return out
        if self._position < 0:
            return np.full(hi - lo, np.nan)
        L = self.grid.chunk
        first, last = lo // L, (hi - 1) // L + 1
        b, local = divmod(r, self.grid.block)
        parts = []
        for c in range(first, last):
            part = self.store.run(self.name, b, c, local)
            if part is None:
                c0, c1 = self.grid.cols(c)
                part = np.full(c1 - c0, np.nan)
            parts.append(part)
        joined = np.concatenate(parts, dtype=np.float64, casting="safe")
        return joined[lo - first * L : hi - first * L]

    def points(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Values at (rows[i], cols[i]) pairs (broadcast together)."""
        rows, cols = np.broadcast_arrays(np.asarray(rows, np.int64), np.asarray(cols, np.int64))
        out = np.full(rows.shape, np.nan)
        if not rows.size:
            return out
        g = self.grid
        cell = (rows // g.block) * g.chunks + cols // g.chunk
        for key in np.unique(cell):
            b, c = divmod(int(key), g.chunks)
            arr = self.chunk(b, c)
            if arr is not None:
                m = cell == key
                out[m] = arr[rows[m] - b * g.block, cols[m] - c * g.chunk]
        return out

    def outer(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The (len(rows) x len(cols)) block of every row at every column."""
        g = self.grid
        out = np.full((len(rows), len(cols)), np.nan)
        row_block, col_chunk = rows // g.block, cols // g.chunk
        for b in np.unique(row_block):
            ri = np.flatnonzero(row_block == b)
            for c in np.unique(col_chunk):
                arr = self.chunk(int(b), int(c))
                if arr is not None:
                    ci = np.flatnonzero(col_chunk == c)
                    sub = arr[np.ix_(rows[ri] - b * g.block, cols[ci] - c * g.chunk)]
                    out[np.ix_(ri, ci)] = sub
        return out

    def __getitem__(self, key: Any) -> Any:
        span = _row_span(key, self.grid.n, self.grid.t)  # the per-ticker read, first
        if span is not None:
            return self.row(*span)
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == 1:
            key = (key[0], slice(None))
        if len(key) != 2:
            raise IndexError(f"a {self.name} array takes two indexes (row, session), got {key!r}")
        r, c = _index(key[0], self.grid.n), _index(key[1], self.grid.t)
        if isinstance(r, int) and isinstance(c, slice):
            lo, hi, step = c.indices(self.grid.t)
            if step == 1:
                return self.row(r, lo, hi)
        if isinstance(r, int) and isinstance(c, int):
            # One value (a ticker's latest metric): its run, directly.
            b, local = divmod(r, self.grid.block)
            k, at = divmod(c, self.grid.chunk)
            run = self.store.run(self.name, b, k, local) if self._position >= 0 else None
            return np.float64(np.nan) if run is None else np.float64(run[at])
        if isinstance(r, int) and isinstance(c, np.ndarray) and c.ndim == 1 and c.size:
            # Sessions picked from one row (Service A: the days a price is published): one
            # row read over their span, then a gather, instead of a lookup per chunk.
            lo, hi = int(c.min()), int(c.max()) + 1
            return self.row(r, lo, hi)[c - lo]
        if not isinstance(r, slice) and not isinstance(c, slice):
            got = self.points(np.asarray(r), np.asarray(c))
            return got[()] if got.ndim == 0 else got
        rows = np.arange(self.grid.n)[r] if isinstance(r, slice) else np.atleast_1d(r)
        cols = np.arange(self.grid.t)[c] if isinstance(c, slice) else np.atleast_1d(c)
        block = self.outer(rows.ravel(), cols.ravel())
        if isinstance(r, int):
            return block[0]
        if isinstance(c, int):
            return block[:, 0]
        return block.reshape(*rows.shape, *cols.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        full: np.ndarray = self.outer(np.arange(self.grid.n), np.arange(self.grid.t))
        return full if dtype is None else full.astype(dtype)


class DerivedArray:
    """A field computed on read from stored ones (see DERIVATIONS); a long read of one row
    (`a[r, lo:hi]` over more than two chunks) is a view of the row the store assembled, where
    the field was computed with the others."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(
        self, op: str, sources: list[FieldArray], store: ChunkStore | None = None, name: str = ""
    ) -> None:
        self.op, self.sources = op, sources
        self.shape = sources[0].shape
        self._store = store
        self._position = store.position.get(name, -1) if store is not None else -1

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, key: Any) -> Any:
        if self._store is not None and self._position >= 0:
            whole = key if type(key) is tuple else (key, slice(None))  # `a[r]` reads row r
            span = _row_span(whole, *self.shape)
            if span is not None and self._store.is_long(span[1], span[2]):
                r, lo, hi = span
                out: np.ndarray = self._store.cached_row(r)[self._position, lo:hi]
                return out
        with np.errstate(all="ignore"):
            return derive(self.op, [s[key] for s in self.sources])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        full = np.asarray(self[:, :], dtype=np.float64)
        return full if dtype is None else full.astype(dtype)


def open_arrays(folder: Path, arrays: Mapping[str, Any]) -> dict[str, FieldArray]:
    """Every field of a chunked version (stored and derived), from its manifest block."""
    layout = str(arrays.get("layout", DENSE_GROUPS))
    derived = arrays["derived"]
    grid = ChunkGrid.of(arrays["grid"])
    store = ChunkStore(folder, grid, arrays["chunks"], layout, derived)
    out: dict[str, FieldArray] = {name: ChunkedArray(store, name) for name in arrays["chunks"]}
    for name, (op, *sources) in derived.items():
        out[name] = DerivedArray(op, [out[s] for s in sources], store, name)
    return out


def expected_chunks(
    arrays: Mapping[str, Any],
) -> Iterator[tuple[Path, tuple[int | None, ...], str]]:
    """(path, shape, dtype code in FILE_DTYPES) of every chunk file a manifest's `arrays` block
    lists; None in a shape is any length (the runs a group file holds)."""
    grid = ChunkGrid.of(arrays["grid"])
    dense_groups = arrays.get("layout", DENSE_GROUPS) == DENSE_GROUPS
    table = arrays["chunks"]
    for name, codes in table.items():
        if len(codes) != grid.blocks or any(len(line) != grid.chunks for line in codes):
            raise ValueError(f"chunk table of {name} does not fit the grid")
    for b, c in grid.cells():
        r0, r1 = grid.rows(b)
        c0, c1 = grid.cols(c)
        grouped = 0
        for name in sorted(table):
            code = table[name][b][c]
            if code == GROUPED:
                grouped += 1
            elif code != EMPTY:
                yield chunk_path(name, b, c), (r1 - r0, c1 - c0), code
        if grouped and dense_groups:
            yield group_path(b, c), (r1 - r0, grouped, c1 - c0), GROUPED
        elif grouped:
            yield group_path(b, c), (None, c1 - c0), GROUPED
            yield runs_path(b, c), (r1 - r0, grouped), RUNS
    for name, (_op, *sources) in arrays["derived"].items():
        missing = [s for s in sources if s not in table]
        if missing:
            raise ValueError(f"derived field {name} names sources not stored: {missing}")


def shape_fits(found: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    """True when a file's shape is the expected one (None: any length on that axis)."""
    return len(found) == len(expected) and all(
        e is None or f == e for f, e in zip(found, expected, strict=True)
    )
