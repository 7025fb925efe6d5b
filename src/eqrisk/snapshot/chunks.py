"""Chunked arrays of a snapshot version: immutable files that consecutive versions share.

Each (n x T) metric is cut along a grid of symbol blocks x time chunks, rows [b*S, (b+1)*S) x
sessions [c*L, (c+1)*L), into files:

    arrays/_rows/<b>.<c>.npy     (rows x fields x L) float64: the chunk of every float64 field,
                                 a row's fields side by side (a ticker's history: one run a chunk)
    arrays/<field>/<b>.<c>.npy   (rows x L): the chunk of a field stored in a narrower dtype

with fixed boundaries at multiples of S and L, so that a new session changes only the last
time chunk of each block (the last chunk holds only the sessions that exist: it grows), and a
worker that computed one symbol block writes that block's files alone. Why these choices, and
the measurements behind them, are in docs/DECISIONS.md ("Issue 10: versions that share history").

- A chunk whose values are all NaN is not stored (the manifest says so; it reads back as NaN).
- A chunk is stored in the narrowest of uint8, uint16, float32 and float64 that gives back the
  same float64 bits, so counts (n_obs) take a byte and floats stay exact.
- A field that is an exact function of stored ones (an alias, `a - b`, `1 - a`: IEEE operations
  that give the same bits on every machine) is not stored when the writer has checked, on the
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
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

LAYOUT = "chunks-1"
CHUNK_SESSIONS = 128  # L: a one-session update rewrites at most L/T of a version
BLOCK_SYMBOLS = 1024  # S: the rows one worker writes as a unit
EMPTY = "."  # manifest code of a chunk that is not stored (all NaN)
GROUPED = "d"  # float64 chunks: stored together, a row's fields contiguous (`group_path`)
GROUP_DIR = "_rows"
ROW_CACHE_BYTES = 64 << 20  # assembled rows kept per version (see ChunkStore.full_row)
CODES: dict[str, np.dtype[Any]] = {
    "B": np.dtype(np.uint8),
    "H": np.dtype(np.uint16),
    "f": np.dtype(np.float32),
    "d": np.dtype(np.float64),
}
CODE_OF = {dtype: code for code, dtype in CODES.items()}

# Fields that are exact functions of others: (operation, source fields). Stored anyway when the
# writer finds a single differing bit.
DERIVATIONS: dict[str, tuple[str, ...]] = {
    "beta_mkt": ("same", "l1_mkt_hr"),
    "beta_sec": ("same", "l2_sec_hr"),
    "l1_rr": ("minus", "return", "l1_cfr"),
    "l2_rr": ("minus", "return", "l2_cfr"),
    "l3_rr": ("minus", "return", "l3_cfr"),
    "l1_res_er": ("one_minus", "l1_mkt_er"),
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


def chunk_path(name: str, b: int, c: int) -> Path:
    """Path of one field's own chunk file (a narrow dtype) inside a version folder."""
    return Path("arrays") / name / f"{b}.{c}.npy"


def group_path(b: int, c: int) -> Path:
    """Path of the group file of (block b, chunk c): its float64 fields, (rows x fields x L)."""
    return Path("arrays") / GROUP_DIR / f"{b}.{c}.npy"


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
    names = sorted(fields)
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
            _store(folder, group_path(b, c), np.stack(group, axis=1), previous, stats)
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


def derive(op: str, sources: list[Any]) -> Any:
    """Apply one derivation to values read from its sources (arrays or scalars)."""
    if op == "same":
        return sources[0]
    if op == "minus":
        return np.subtract(sources[0], sources[1])
    if op == "one_minus":
        return np.subtract(1.0, sources[0])
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


class ChunkStore:
    """The stored chunks of one version: opened on first use, and the assembled rows.

    An answer reads several fields of a row (a ticker's answer: 27; Service A: the price and
    the fields asked); assembling every stored field of that row at once reads one contiguous
    run per chunk (the group file) instead of one per field and chunk. So a read spanning more
    than two chunks assembles the whole row and keeps it for the next fields (first in, first
    out, ROW_CACHE_BYTES at most); short reads take the field's own chunks."""

    def __init__(self, folder: Path, grid: ChunkGrid, codes: Mapping[str, list[str]]) -> None:
        self.folder, self.grid, self.codes = folder, grid, codes

        # Rows of an assembled row: the fields stored only in group files first (so that a
        # group lands in one contiguous run of rows), then the others; alphabetical within.
        def only_grouped(name: str) -> bool:
            return set("".join(codes[name])) - {EMPTY} == {GROUPED}

        # Fields never stored (all NaN) have no row in it.
        stored = [n for n in codes if set("".join(codes[n])) != {EMPTY}]
        self.names = sorted(stored, key=lambda n: (not only_grouped(n), n))
        self.position = {name: i for i, name in enumerate(self.names)}
        self._files: dict[Path, np.ndarray] = {}
        self._chunks: dict[tuple[str, int, int], np.ndarray | None] = {}
        self._members: dict[tuple[int, int], list[int]] = {}
        self._plans: dict[tuple[int, int], tuple[np.ndarray | None, Any, list[Any], list[int]]] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        row_bytes = max(1, len(self.names) * grid.t * 8)
        self._keep = max(2, ROW_CACHE_BYTES // row_bytes)

    def _file(self, rel: Path) -> np.ndarray:
        arr = self._files.get(rel)
        if arr is None:
            arr = np.asarray(np.load(self.folder / rel, mmap_mode="r"))
            self._files[rel] = arr
        return arr

    def members(self, b: int, c: int) -> list[int]:
        """Positions (in `names`) of the fields in the group file of (b, c), in file order
        (alphabetical, as the writer stacked them)."""
        found = self._members.get((b, c))
        if found is None:
            found = [self.position[n] for n in sorted(self.codes) if self.codes[n][b][c] == GROUPED]
            self._members[b, c] = found
        return found

    def chunk(self, name: str, b: int, c: int) -> np.ndarray | None:
        """One field's (rows x L) chunk, its stored dtype; None when not stored (all NaN).
        Kept once found: a ticker's latest metrics read one value of many fields."""
        key = (name, b, c)
        try:
            return self._chunks[key]
        except KeyError:
            pass
        found = self._find_chunk(name, b, c)
        self._chunks[key] = found
        return found

    def _find_chunk(self, name: str, b: int, c: int) -> np.ndarray | None:
        code = self.codes[name][b][c]  # a field never stored has only EMPTY codes
        if code == EMPTY:
            return None
        if code != GROUPED:
            return self._file(chunk_path(name, b, c))
        group = self._file(group_path(b, c))
        return group[:, self.members(b, c).index(self.position[name]), :]

    def cached_row(self, r: int) -> np.ndarray:
        """The assembled (fields x T) row r: kept for the next fields of the same answer."""
        row = self._rows.get(r)  # a dict read is atomic: no lock on the hit path
        if row is None:
            row = self.full_row(r)
            with self._lock:
                self._rows[r] = row
                while len(self._rows) > self._keep:  # first in, first out
                    self._rows.pop(next(iter(self._rows)))
        return row

    def forget(self) -> None:
        """Drop the assembled rows (a benchmark times reads, not this cache)."""
        with self._lock:
            self._rows.clear()

    def _plan(self, b: int, c: int) -> tuple[np.ndarray | None, Any, list[Any], list[int]]:
        """What chunk (b, c) holds: its group file, the rows its fields go to (a slice when
        contiguous), the (position, array) of each field stored on its own, and the positions
        of the fields it does not store (all NaN there); opened once."""
        plan = self._plans.get((b, c))
        if plan is None:
            positions = self.members(b, c)
            group = self._file(group_path(b, c)) if positions else None
            members: Any = positions
            if positions and positions == list(range(positions[0], positions[0] + len(positions))):
                members = slice(positions[0], positions[0] + len(positions))
            own = [
                (i, self._file(chunk_path(name, b, c)))
                for i, name in enumerate(self.names)
                if self.codes[name][b][c] not in (EMPTY, GROUPED)
            ]
            empty = [i for i, name in enumerate(self.names) if self.codes[name][b][c] == EMPTY]
            plan = (group, members, own, empty)
            self._plans[b, c] = plan
        return plan

    def full_row(self, r: int) -> np.ndarray:
        """Every stored field of row r over all sessions, (fields x T) float64, read-only."""
        g = self.grid
        b, local = divmod(r, g.block)
        out = np.empty((len(self.names), g.t))
        for c in range(g.chunks):
            c0, c1 = c * g.chunk, min(g.t, (c + 1) * g.chunk)
            group, members, own, empty = self._plan(b, c)
            if group is not None:
                out[members, c0:c1] = group[local]
            for i, arr in own:
                out[i, c0:c1] = arr[local]
            if empty:
                out[empty, c0:c1] = np.nan
        out.flags.writeable = False
        return out


class ChunkedArray:
    """One stored field of a chunked version, read as the dense (n x T) float64 array it was."""

    shape: tuple[int, int]
    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, store: ChunkStore, name: str) -> None:
        self.store, self.name, self.grid = store, name, store.grid
        self.shape = (store.grid.n, store.grid.t)
        self._position = store.position.get(name, -1)  # -1: never stored, all NaN
        self._pieces: dict[int, list[np.ndarray]] = {}

    def __len__(self) -> int:
        return self.grid.n

    def chunk(self, b: int, c: int) -> np.ndarray | None:
        """The stored chunk (memory-mapped, its own dtype), None when not stored (all NaN)."""
        return self.store.chunk(self.name, b, c)

    def pieces(self, b: int) -> list[np.ndarray]:
        """Every chunk of block b in time order (an all-NaN chunk is a read-only NaN view)."""
        found = self._pieces.get(b)
        if found is None:
            r0, r1 = self.grid.rows(b)
            found = []
            for c in range(self.grid.chunks):
                arr = self.chunk(b, c)
                if arr is None:
                    c0, c1 = self.grid.cols(c)
                    arr = np.broadcast_to(np.float64(np.nan), (r1 - r0, c1 - c0))
                found.append(arr)
            self._pieces[b] = found
        return found

    def row(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of row r: the per-ticker read (from the assembled row when the
        store keeps it, else one copy of the chunks it spans)."""
        if hi <= lo or self._position < 0:
            return np.full(max(0, hi - lo), np.nan)
        L = self.grid.chunk
        first, last = lo // L, (hi - 1) // L + 1
        if last - first > 2:  # a long read: a ticker's answer, which reads its other fields too
            out: np.ndarray = self.store.cached_row(r)[self._position, lo:hi]
            return out
        b, local = divmod(r, self.grid.block)
        parts = [p[local] for p in self.pieces(b)[first:last]]
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
            # One value (a ticker's latest metric): its chunk, directly.
            b, local = divmod(r, self.grid.block)
            k, at = divmod(c, self.grid.chunk)
            arr = self.chunk(b, k)
            return np.float64(np.nan) if arr is None else np.float64(arr[local, at])
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
    """A field computed on read from stored ones (see DERIVATIONS)."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, op: str, sources: list[FieldArray]) -> None:
        self.op, self.sources = op, sources
        self.shape = sources[0].shape

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, key: Any) -> Any:
        with np.errstate(all="ignore"):
            return derive(self.op, [s[key] for s in self.sources])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        full = np.asarray(self[:, :], dtype=np.float64)
        return full if dtype is None else full.astype(dtype)


def open_arrays(folder: Path, arrays: Mapping[str, Any]) -> dict[str, FieldArray]:
    """Every field of a chunked version (stored and derived), from its manifest block."""
    store = ChunkStore(folder, ChunkGrid.of(arrays["grid"]), arrays["chunks"])
    out: dict[str, FieldArray] = {name: ChunkedArray(store, name) for name in arrays["chunks"]}
    for name, (op, *sources) in arrays["derived"].items():
        out[name] = DerivedArray(op, [out[s] for s in sources])
    return out


def expected_chunks(arrays: Mapping[str, Any]) -> Iterator[tuple[Path, tuple[int, ...], str]]:
    """(path, shape, dtype code) of every chunk file a manifest's `arrays` block lists."""
    grid = ChunkGrid.of(arrays["grid"])
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
        if grouped:
            yield group_path(b, c), (r1 - r0, grouped, c1 - c0), GROUPED
    for name, (_op, *sources) in arrays["derived"].items():
        missing = [s for s in sources if s not in table]
        if missing:
            raise ValueError(f"derived field {name} names sources not stored: {missing}")
