"""How a field of a chunked version is indexed like the dense (n x T) array it replaces:
stored fields (`ChunkedArray`) and derived ones (`DerivedArray`) on one base."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from eqrisk.snapshot.chunks.derivations import derive
from eqrisk.snapshot.chunks.grid import ChunkGrid, FieldArray


class ChunkStore(Protocol):
    """What a field reads of the stored chunks of its version (`reader.ChunkStore`, which
    opens the fields: so this module imports it not)."""

    @property
    def grid(self) -> ChunkGrid: ...
    @property
    def position(self) -> dict[str, int]: ...
    @property
    def nan_row(self) -> np.ndarray: ...
    def run(self, name: str, b: int, c: int, local: int) -> np.ndarray | None: ...
    def dense(self, name: str, b: int, c: int) -> np.ndarray | None: ...
    def copy_part(
        self, name: str, b: int, c: int, rows: slice, cols: slice, out: np.ndarray
    ) -> None: ...
    def is_long(self, lo: int, hi: int) -> bool: ...
    def cached_row(self, r: int) -> np.ndarray: ...
    def forget(self) -> None: ...


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


def _row_span(key: Any, n: int, t: int) -> tuple[int, int, int] | None:
    """(row, lo, hi) when `key` is the per-ticker read `[row, lo:hi]` (an int row in range, a
    step-less slice of sessions), else None: the fast path of every field's indexing."""
    if type(key) is tuple and len(key) == 2:
        r, cols = key
        if type(r) is int and type(cols) is slice and cols.step is None and 0 <= r < n:
            lo, hi, _ = cols.indices(t)
            return r, lo, hi
    return None


class FieldIndexing:
    """What every field of a chunked version shares: an (n x T) float64 array's shape, the
    per-ticker long read (`a[r, lo:hi]` over more than two chunks) served from the row the
    store assembled with every field, and `np.asarray` of the whole."""

    ndim = 2
    dtype = np.dtype(np.float64)
    shape: tuple[int, int]
    _store: ChunkStore | None
    _position: int  # the field's row in an assembled row, -1: none (never stored)

    def __len__(self) -> int:
        return int(self.shape[0])

    def _assembled(self, r: int, lo: int, hi: int) -> np.ndarray | None:
        """Sessions [lo, hi) of row r from the store's assembled row, when the read is long
        and the field has a row there; else None (the caller reads its own runs)."""
        store = self._store
        if store is None or self._position < 0 or not store.is_long(lo, hi):
            return None
        out: np.ndarray = store.cached_row(r)[self._position, lo:hi]
        return out

    def _whole(self) -> np.ndarray:
        raise NotImplementedError

    def __array__(self, dtype: Any = None, /, *, copy: Any = None) -> np.ndarray:
        full = self._whole()
        return full if dtype is None else full.astype(dtype)


class ChunkedArray(FieldIndexing):
    """One stored field of a chunked version, read as the dense (n x T) float64 array it was."""

    def __init__(self, store: ChunkStore, name: str) -> None:
        self.store, self.name, self.grid = store, name, store.grid
        self._store = store
        self.shape = (store.grid.n, store.grid.t)
        self._position = store.position.get(name, -1)  # -1: never stored, all NaN

    def chunk(self, b: int, c: int) -> np.ndarray | None:
        """The (rows x L) chunk (its stored dtype), None when not stored (all NaN)."""
        return self.store.dense(self.name, b, c)

    def row(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of row r: the per-ticker read (from the assembled row when the
        store keeps it, else one copy of the runs it spans)."""
        if hi <= lo:
            return np.full(0, np.nan)
        assembled = self._assembled(r, lo, hi)
        if assembled is not None:
            return assembled
        return self.own_row(r, lo, hi)

    def own_row(self, r: int, lo: int, hi: int) -> np.ndarray:
        """Sessions [lo, hi) of row r from this field's own runs, never from the assembled
        row: a read of one field of many rows (a batch's prices), which through the assembled
        rows would assemble every row's other fields too, only for the small row cache to
        evict them before they are read."""
        if hi <= lo:
            return np.full(0, np.nan)
        if self._position < 0 and self.store.is_long(lo, hi):
            return self.store.nan_row[lo:hi]
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

    def span(self, r0: int, r1: int, c0: int, c1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [r0, r1) at sessions [c0, c1): `outer` of two ranges, each chunk's part copied
        as one slice (no index arrays) straight from its file or group (`copy_part`); into
        `out` ((r1 - r0) x (c1 - c0) float64, a view may do) where given."""
        g = self.grid
        if out is None:
            out = np.full((r1 - r0, c1 - c0), np.nan)
        else:
            out[...] = np.nan
        if self._position < 0:
            return out  # never stored: all NaN
        for b in range(r0 // g.block, -(-r1 // g.block)):
            top, bottom = max(r0, b * g.block), min(r1, (b + 1) * g.block)
            rows = slice(top - b * g.block, bottom - b * g.block)
            for c in range(c0 // g.chunk, -(-c1 // g.chunk)):
                left, right = max(c0, c * g.chunk), min(c1, (c + 1) * g.chunk)
                self.store.copy_part(
                    self.name,
                    b,
                    c,
                    rows,
                    slice(left - c * g.chunk, right - c * g.chunk),
                    out[top - r0 : bottom - r0, left - c0 : right - c0],
                )
        return out

    def __getitem__(self, key: Any) -> Any:
        span = _row_span(key, self.grid.n, self.grid.t)  # the per-ticker read, first
        if span is not None:
            return self.row(*span)
        r, c = self._axes(key)
        if isinstance(r, int):
            found = self._from_row(r, c)
            if found is not None:
                return found
        if not isinstance(r, slice) and not isinstance(c, slice):
            got = self.points(np.asarray(r), np.asarray(c))
            return got[()] if got.ndim == 0 else got
        return self._block(r, c)

    def _axes(self, key: Any) -> tuple[int | slice | np.ndarray, int | slice | np.ndarray]:
        """The (row, session) index of `key`, each checked (`a[r]` reads row r)."""
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) == 1:
            key = (key[0], slice(None))
        if len(key) != 2:
            raise IndexError(f"a {self.name} array takes two indexes (row, session), got {key!r}")
        return _index(key[0], self.grid.n), _index(key[1], self.grid.t)

    def _from_row(self, r: int, c: int | slice | np.ndarray) -> Any:
        """The reads of one row that need no block: sessions by a step-less slice, one value,
        or sessions picked by an int array; None for the others."""
        if isinstance(c, slice):
            lo, hi, step = c.indices(self.grid.t)
            return self.row(r, lo, hi) if step == 1 else None
        if isinstance(c, int):
            # One value (a ticker's latest metric): its run, directly.
            b, local = divmod(r, self.grid.block)
            k, at = divmod(c, self.grid.chunk)
            run = self.store.run(self.name, b, k, local) if self._position >= 0 else None
            return np.float64(np.nan) if run is None else np.float64(run[at])
        if c.ndim == 1 and c.size:
            # Sessions picked from one row (Service A: the days a price is published): one
            # row read over their span, then a gather, instead of a lookup per chunk.
            lo, hi = int(c.min()), int(c.max()) + 1
            return self.row(r, lo, hi)[c - lo]
        return None

    def _block(self, r: int | slice | np.ndarray, c: int | slice | np.ndarray) -> np.ndarray:
        """Every row of `r` at every session of `c` (at least one of them a slice)."""
        if isinstance(r, slice) and isinstance(c, slice):
            r0, r1, r_step = r.indices(self.grid.n)
            c0, c1, c_step = c.indices(self.grid.t)
            if r_step == 1 and c_step == 1:
                return self.span(r0, max(r0, r1), c0, max(c0, c1))
        rows = np.arange(self.grid.n)[r] if isinstance(r, slice) else np.atleast_1d(r)
        cols = np.arange(self.grid.t)[c] if isinstance(c, slice) else np.atleast_1d(c)
        block = self.outer(rows.ravel(), cols.ravel())
        if isinstance(r, int):
            out: np.ndarray = block[0]
        elif isinstance(c, int):
            out = block[:, 0]
        else:
            out = block.reshape(*rows.shape, *cols.shape)
        return out

    def _whole(self) -> np.ndarray:
        return self.outer(np.arange(self.grid.n), np.arange(self.grid.t))


class DerivedArray(FieldIndexing):
    """A field computed on read from stored ones (see DERIVATIONS); a long read of one row
    (`a[r, lo:hi]` over more than two chunks) is a view of the row the store assembled, where
    the field was computed with the others."""

    def __init__(
        self, op: str, sources: list[FieldArray], store: ChunkStore | None = None, name: str = ""
    ) -> None:
        self.op, self.sources = op, sources
        self.shape = (int(sources[0].shape[0]), int(sources[0].shape[1]))
        self._store = store
        self._position = store.position.get(name, -1) if store is not None else -1

    def __getitem__(self, key: Any) -> Any:
        if self._store is not None and self._position >= 0:
            whole = key if type(key) is tuple else (key, slice(None))  # `a[r]` reads row r
            span = _row_span(whole, *self.shape)
            if span is not None:
                assembled = self._assembled(*span)
                if assembled is not None:
                    return assembled
        with np.errstate(all="ignore"):
            return derive(self.op, [s[key] for s in self.sources])

    def _whole(self) -> np.ndarray:
        return np.asarray(self[:, :], dtype=np.float64)


def field_span(arr: FieldArray, r: int, lo: int, hi: int) -> np.ndarray:
    """Sessions [lo, hi) of row r of one field, read without assembling the row's other
    fields (`ChunkedArray.own_row`; any other array is sliced as it is)."""
    if isinstance(arr, ChunkedArray):
        return arr.own_row(r, lo, hi)
    out: np.ndarray = np.asarray(arr[r, lo:hi])
    return out
