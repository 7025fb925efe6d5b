"""Chunked arrays of a snapshot version: immutable files that consecutive versions share.

Each (n x T) metric is cut into a grid of (symbol block x time chunk) files:

    arrays/<field>/<block>.<chunk>.npy   rows [block*S, (block+1)*S) x sessions [chunk*L, ...)

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

LAYOUT = "chunks-1"
CHUNK_SESSIONS = 128  # L: a one-session update rewrites at most L/T of a version
BLOCK_SYMBOLS = 1024  # S: the rows one worker writes as a unit
EMPTY = "."  # manifest code of a chunk that is not stored (all NaN)
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
    """Path of one chunk file inside a version folder."""
    return Path("arrays") / name / f"{b}.{c}.npy"


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
    written_cells: list[tuple[str, int, int]] = field(default_factory=list)

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


def write_field(
    folder: Path,
    name: str,
    values: Sliceable,
    grid: ChunkGrid,
    *,
    previous: Path | None = None,
    blocks: range | None = None,
    stats: WriteStats | None = None,
) -> list[str]:
    """Write the chunks of one field (of the given blocks, all by default) into `folder`.

    Returns one code string per block written, a character per chunk (`EMPTY` or the dtype)."""
    stats = stats if stats is not None else WriteStats()
    codes = []
    for b in blocks if blocks is not None else range(grid.blocks):
        r0, r1 = grid.rows(b)
        line = []
        for c in range(grid.chunks):
            c0, c1 = grid.cols(c)
            block = np.ascontiguousarray(values[r0:r1, c0:c1], dtype=np.float64)
            if np.isnan(block).all():
                stats.empty += 1
                line.append(EMPTY)
                continue
            stored = narrowest(block)
            line.append(CODE_OF[stored.dtype])
            rel = chunk_path(name, b, c)
            if share_or_write(
                folder,
                rel,
                previous,
                _chunk_equals(stored),
                _saver(stored),
            ):
                stats.shared += 1
            else:
                stats.written += 1
                stats.bytes_written += (folder / rel).stat().st_size
                stats.written_cells.append((name, b, c))
        codes.append("".join(line))
    return codes


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


def write_arrays(
    folder: Path,
    fields: Mapping[str, Sliceable],
    grid: ChunkGrid,
    *,
    previous: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], WriteStats]:
    """Write every field as chunks; returns the manifest's `arrays` block and the stats."""
    stats = WriteStats()
    chunks: dict[str, list[str]] = {}
    derived: dict[str, list[str]] = {}
    for name in sorted(fields):
        if derivable(name, fields, grid):
            derived[name] = list(DERIVATIONS[name])
            stats.derived.append(name)
            continue
        chunks[name] = write_field(folder, name, fields[name], grid, previous=previous, stats=stats)
        if progress:
            progress(f"arrays: {name}")
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


class ChunkedArray:
    """One field of a chunked version, read as the dense (n x T) float64 array it was."""

    shape: tuple[int, int]
    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, folder: Path, name: str, grid: ChunkGrid, codes: list[str]) -> None:
        self.folder, self.name, self.grid, self.codes = folder, name, grid, codes
        self.shape = (grid.n, grid.t)
        self._open: dict[tuple[int, int], np.ndarray | None] = {}
        self._pieces: dict[int, list[np.ndarray]] = {}

    def __len__(self) -> int:
        return self.grid.n

    def chunk(self, b: int, c: int) -> np.ndarray | None:
        """The stored chunk (memory-mapped, its own dtype), None when not stored (all NaN)."""
        try:
            return self._open[b, c]
        except KeyError:
            pass
        arr = None
        if self.codes[b][c] != EMPTY:
            arr = np.asarray(np.load(self.folder / chunk_path(self.name, b, c), mmap_mode="r"))
        self._open[b, c] = arr
        return arr

    def pieces(self, b: int) -> list[np.ndarray]:
        """Every chunk of block b in time order, opened at once (an all-NaN chunk is a
        read-only NaN view): a row read is then one concatenation of row views."""
        try:
            return self._pieces[b]
        except KeyError:
            pass
        r0, r1 = self.grid.rows(b)
        out = []
        for c in range(self.grid.chunks):
            arr = self.chunk(b, c)
            if arr is None:
                c0, c1 = self.grid.cols(c)
                arr = np.broadcast_to(np.float64(np.nan), (r1 - r0, c1 - c0))
            out.append(arr)
        self._pieces[b] = out
        return out

    def row(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of row r: the per-ticker read, one copy of the chunks it spans."""
        if hi <= lo:
            return np.empty(0)
        L = self.grid.chunk
        b, local = divmod(r, self.grid.block)
        first, last = lo // L, (hi - 1) // L + 1
        parts = [p[local] for p in self.pieces(b)[first:last]]
        out = np.concatenate(parts, dtype=np.float64, casting="safe")
        return out[lo - first * L : hi - first * L]

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
    grid = ChunkGrid.of(arrays["grid"])
    out: dict[str, FieldArray] = {
        name: ChunkedArray(folder, name, grid, codes) for name, codes in arrays["chunks"].items()
    }
    for name, (op, *sources) in arrays["derived"].items():
        out[name] = DerivedArray(op, [out[s] for s in sources])
    return out


def expected_chunks(arrays: Mapping[str, Any]) -> Iterator[tuple[Path, tuple[int, int], str]]:
    """(path, shape, dtype code) of every chunk file a manifest's `arrays` block lists."""
    grid = ChunkGrid.of(arrays["grid"])
    for name, codes in arrays["chunks"].items():
        if len(codes) != grid.blocks or any(len(line) != grid.chunks for line in codes):
            raise ValueError(f"chunk table of {name} does not fit the grid")
        for b, c in grid.cells():
            code = codes[b][c]
            if code != EMPTY:
                r0, r1 = grid.rows(b)
                c0, c1 = grid.cols(c)
                yield chunk_path(name, b, c), (r1 - r0, c1 - c0), code
    for name, (_op, *sources) in arrays["derived"].items():
        missing = [s for s in sources if s not in arrays["chunks"]]
        if missing:
            raise ValueError(f"derived field {name} names sources not stored: {missing}")
