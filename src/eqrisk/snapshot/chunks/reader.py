"""Reading a version's chunks: each chunk opened once (memory-mapped), and a ticker's whole
row assembled in one compiled call when an answer reads several of its fields."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.snapshot import row_kernel
from eqrisk.snapshot.chunks.grid import (
    DENSE_GROUPS,
    EMPTY,
    GROUPED,
    LAYOUT,
    ChunkGrid,
    FieldArray,
)
from eqrisk.snapshot.chunks.indexing import ChunkedArray, DerivedArray
from eqrisk.snapshot.chunks.layout import chunk_path, group_order, group_path, runs_path

ROW_CACHE_BYTES = 8 << 20  # assembled rows kept per version (why so few: ChunkStore.cached_row)
Copy = tuple[int, int, int]  # rows [lo, hi) of an assembled row <- runs from `off` (-1: NaN)

_KERNEL_OPS = {
    "minus": row_kernel.MINUS,
    "one_minus": row_kernel.ONE_MINUS,
    "one_minus_known": row_kernel.ONE_MINUS_KNOWN,
}


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


@dataclass(frozen=True)
class _Group:
    """The group file of chunk (b, c) (`data`, (runs x L)), its index (`runs`, (rows x
    members)), each field's column in `runs` (`slot`) and the chunk's width; `data` and `runs`
    None when no field of the chunk is grouped."""

    width: int
    data: np.ndarray | None
    runs: np.ndarray | None
    slot: dict[int, int]


@dataclass(frozen=True)
class _Plan:
    """The tables `row_kernel.assemble` walks for a row of one block (`tables`, its arguments
    after the row's), and the block's cells: the tables hold the addresses of the cells'
    mapped files, which stay mapped while the plan is alive (an address into an unmapped file
    crashes the process)."""

    tables: tuple[Any, ...]
    cells: list[_Cell]


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
        self._file_chunk: dict[Path, int] = {}  # each opened file's time chunk
        self._cells: dict[tuple[int, int], _Cell] = {}
        self._groups: dict[tuple[int, int], _Group] = {}
        self._plans: dict[int, _Plan] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._spare: list[np.ndarray] = []  # evicted rows' memory, for the next (`_recycle`)
        self._lock = threading.Lock()
        self._local = threading.local()
        row_bytes = max(1, len(self.fields) * grid.t * 8)
        self._keep = max(2, ROW_CACHE_BYTES // row_bytes)
        self.nan_row = np.full(grid.t, np.nan)  # what a field never stored reads as
        self.nan_row.flags.writeable = False

    def _file(self, rel: Path, c: int) -> np.ndarray:
        """The file `rel` of time chunk c, memory-mapped once (until `close_files`)."""
        arr = self._files.get(rel)
        if arr is None:
            # Two threads may open it at once: the first one kept is everyone's (a mapping
            # replaced while another thread reads it would be unmapped under that thread).
            arr = self._files.setdefault(rel, np.asarray(np.load(self.folder / rel, mmap_mode="r")))
            self._file_chunk[rel] = c
        return arr

    def cell(self, b: int, c: int) -> _Cell:
        """Chunk (b, c), opened once (see `_Cell`)."""
        found = self._cells.get((b, c))
        if found is None:
            found = self._cells.setdefault((b, c), self._open_cell(b, c))  # the first kept
        return found

    def group(self, b: int, c: int) -> _Group:
        """The group file of chunk (b, c) and its index, opened once: what a read of a whole
        field's chunk needs (`dense`, `copy_part`), without the row-assembly tables `cell`
        builds (their `np.unique` of the runs' pattern costs more than the read)."""
        found = self._groups.get((b, c))
        if found is None:
            found = self._groups.setdefault((b, c), self._open_group(b, c))  # the first kept
        return found

    def _open_group(self, b: int, c: int) -> _Group:
        c0, c1 = self.grid.cols(c)
        # Group file order: as the writer stacked them.
        grouped = [n for n in sorted(self.codes, key=self._order) if self.codes[n][b][c] == GROUPED]
        slot = {self.position[n]: j for j, n in enumerate(grouped)}
        data = runs = None
        if grouped:
            data = self._file(group_path(b, c), c)
            if self.layout == DENSE_GROUPS:  # every run stored, in row-major order
                rows, k, width = data.shape
                data = data.reshape(rows * k, width)
                runs = np.arange(rows * k, dtype=np.int32).reshape(rows, k)
            else:
                runs = np.array(self._file(runs_path(b, c), c))
        return _Group(width=c1 - c0, data=data, runs=runs, slot=slot)

    def _open_cell(self, b: int, c: int) -> _Cell:
        r0, r1 = self.grid.rows(b)
        group = self.group(b, c)
        data, runs, slot = group.data, group.runs, group.slot
        present = np.zeros((r1 - r0, 0), dtype=bool)
        first = np.zeros(r1 - r0, dtype=np.int64)
        if runs is not None:
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
            (i, self._file(chunk_path(name, b, c), c))
            for i, name in enumerate(self.names)
            if self.codes[name][b][c] not in (EMPTY, GROUPED)
        ]
        return _Cell(
            width=group.width,
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
            own: np.ndarray = self._file(chunk_path(name, b, c), c)[local]
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
            return self._file(chunk_path(name, b, c), c)
        group = self.group(b, c)
        assert group.runs is not None and group.data is not None
        at = group.runs[:, group.slot[self.position[name]]]
        out = np.full((len(at), group.width), np.nan)
        kept = at >= 0
        out[kept] = group.data[at[kept]]
        return out

    def copy_part(
        self, name: str, b: int, c: int, rows: slice, cols: slice, out: np.ndarray
    ) -> None:
        """Rows `rows` at columns `cols` (both local to chunk (b, c)) of one field into `out`
        (float64, NaN where nothing is stored: the caller's fill): straight from the chunk's
        file or its group's runs, without the whole chunk `dense` would make first."""
        code = self.codes[name][b][c]
        if code == EMPTY:
            return
        if code != GROUPED:
            out[...] = self._file(chunk_path(name, b, c), c)[rows, cols]
            return
        group = self.group(b, c)
        assert group.runs is not None and group.data is not None
        at = group.runs[rows, group.slot[self.position[name]]]
        kept = np.flatnonzero(at >= 0)
        if len(kept) == len(at):
            out[...] = group.data[at, cols]
        elif len(kept):
            out[kept] = group.data[at[kept], cols]

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

    def close_files(self, before: int | None = None) -> None:
        """Unmap every chunk file opened so far (and the cells that view them): a pass over
        the whole version (a build writing its tables) calls it between its steps, so the
        mapped pages it read leave this process instead of adding up to the version's size.
        With `before` (a session), only the files of the time chunks that end at or before
        it: a pass whose next step reads from session `before` on (the risk model, a chunk and
        its history at a time) keeps the chunks it reads again mapped."""
        with self._lock:
            self._plans.clear()  # a plan holds its block's chunks, every time chunk of them
            if before is None:
                self._files.clear()
                self._file_chunk.clear()
                self._cells.clear()
                self._groups.clear()
                return
            last = before // self.grid.chunk  # chunks < last end at or before `before`
            for rel in [r for r, c in self._file_chunk.items() if c < last]:
                del self._files[rel], self._file_chunk[rel]
            for table in (self._cells, self._groups):
                for key in [k for k in table if k[1] < last]:
                    del table[key]

    def _block_plan(self, b: int) -> _Plan:
        """The tables `row_kernel.assemble` walks for a row of block b (built once), and the
        chunks whose memory they point into."""
        plan = self._plans.get(b)
        if plan is None:
            plan = self._plans.setdefault(b, self._make_plan(b))
        return plan

    def _make_plan(self, b: int) -> _Plan:
        g = self.grid
        # The kernel reads the chunk files at their addresses: the plan holds the cells (and
        # their mappings) for as long as it lives, whatever `close_files` drops meanwhile.
        cells = [self.cell(b, c) for c in range(g.chunks)]
        bounds = np.array([g.cols(c)[0] for c in range(g.chunks)] + [g.t], dtype=np.int64)
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
        tables = (
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
        return _Plan(tables, cells)

    def full_row(self, r: int, out: np.ndarray | None = None) -> np.ndarray:
        """Every field of row r over all sessions, (fields x T) float64 in `fields` order
        (stored, then derived), read-only; written into `out` (a recycled row, no longer
        referenced) when given. One compiled call (`row_kernel.assemble`)."""
        b, local = divmod(r, self.grid.block)
        if out is None:
            out = np.empty((len(self.fields), self.grid.t))
        else:
            out.flags.writeable = True
        plan = self._block_plan(b)  # held until the kernel returns: its chunks stay mapped
        row_kernel.assemble(out, local, *self._scratch(), *plan.tables)
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


def close_files(fields: Mapping[str, Any], before: int | None = None) -> None:
    """`ChunkStore.close_files` of each store behind these fields (the chunked ones): every
    file, or with `before` those of the time chunks that end at or before that session."""
    stores = {
        id(s): s for f in fields.values() if isinstance(s := getattr(f, "_store", None), ChunkStore)
    }
    for store in stores.values():
        store.close_files(before)


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
