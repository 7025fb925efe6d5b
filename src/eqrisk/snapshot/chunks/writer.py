"""Writing a version's chunks: block by block, each chunk in its narrowest dtype (float64
ones together in a group file), a chunk equal to the previous version's a hard link to it."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from eqrisk.snapshot.chunks.derivations import DERIVATIONS, derivable
from eqrisk.snapshot.chunks.grid import CODE_OF, EMPTY, GROUPED, LAYOUT, ChunkGrid, Sliceable
from eqrisk.snapshot.chunks.layout import (
    chunk_path,
    group_order,
    group_path,
    group_runs,
    narrowest,
    runs_path,
    same_bits,
)
from eqrisk.snapshot.integrity import save_array

R = TypeVar("R")


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

    def add(self, other: WriteStats) -> None:
        """Count what `other` did too (its files after these)."""
        self.written += other.written
        self.shared += other.shared
        self.empty += other.empty
        self.bytes_written += other.bytes_written
        self.derived.extend(other.derived)
        self.written_files.extend(other.written_files)

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
    try:
        try:
            os.link(previous / rel, target)
        except FileNotFoundError:  # the folder is new (the link's source missing: raised again)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(previous / rel, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(previous / rel, target)


def chunk_equals(stored: np.ndarray) -> Callable[[Path], bool]:
    def same(old: Path) -> bool:
        try:
            previous = np.load(old, mmap_mode="r")
        except (ValueError, OSError):
            return False  # damaged or unreadable: never linked
        return same_bits(np.asarray(previous), stored)

    return same


def _saver(values: np.ndarray) -> Callable[[Path], None]:
    def save(path: Path) -> None:
        save_array(path, values)

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
    writers: int = 1,
) -> dict[str, str]:
    """Write the chunks of symbol block b of every field: per time chunk, the float64 fields
    together in one row-major group file, the others (narrow dtypes) each in its own.

    `writers` threads write the time chunks side by side (each file is one chunk's: the
    files, codes and stats are those of one writer, merged in chunk order); the numpy work
    of a chunk (copies, NaN scans, narrowing, grouping) and its writes release the GIL.

    With `reuse` = c0 (an incremental build), the chunks c < c0 are hard links to the files of
    the `previous` version, whose block-b codes `previous_codes` gives, never read: the fields
    read only from chunk c0 on.

    A worker that computed block b calls this alone. Returns, per field, the block's code
    string: one character per chunk, `EMPTY` or the stored dtype ('d': in the group)."""
    stats = stats if stats is not None else WriteStats()
    names = sorted(fields, key=group_order)
    codes: dict[str, list[str]] = {name: [] for name in names}
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
    buffers = threading.local()  # each writer's chunk buffer, reused chunk after chunk

    def write(c: int) -> tuple[dict[str, list[str]], WriteStats]:
        own_codes: dict[str, list[str]] = {name: [] for name in names}
        own_stats = WriteStats()
        buffers.it = _write_chunk(
            folder, fields, names, grid, (b, c), getattr(buffers, "it", np.empty(0)), previous,
            own_stats, own_codes,
        )  # fmt: skip
        return own_codes, own_stats

    for own_codes, own_stats in _chunks_on(writers, range(reuse, grid.chunks), write):
        for name, line in own_codes.items():
            codes[name].extend(line)
        stats.add(own_stats)
    return {name: "".join(line) for name, line in codes.items()}


def _chunks_on(writers: int, chunks: range, write: Callable[[int], R]) -> Iterator[R]:
    """`write(c)` of every chunk, in chunk order, on `writers` threads (this one alone for 1);
    at most two chunks a writer are in flight."""
    if writers <= 1 or len(chunks) <= 1:
        yield from map(write, chunks)
        return
    with ThreadPoolExecutor(writers, thread_name_prefix="eqrisk-chunks") as pool:
        queued: deque[Future[R]] = deque()
        for c in chunks:
            if len(queued) >= 2 * writers:
                yield queued.popleft().result()
            queued.append(pool.submit(write, c))
        while queued:
            yield queued.popleft().result()


def _write_chunk(
    folder: Path,
    fields: Mapping[str, Sliceable],
    names: list[str],
    grid: ChunkGrid,
    at: tuple[int, int],
    buffer: np.ndarray,
    previous: Path | None,
    stats: WriteStats,
    codes: dict[str, list[str]],
) -> np.ndarray:
    """Write chunk `at` = (b, c) of every field (`names`: in the group file's order), adding
    each one's code to `codes`. Every field's chunk is copied once, side by side into
    `buffer` (rows x fields x L: the group file's layout, reallocated when the chunk's shape
    differs), and the float64 ones are grouped from there. Returns the buffer."""
    b, c = at
    (r0, r1), (c0, c1) = grid.rows(b), grid.cols(c)
    shape = (r1 - r0, len(names), c1 - c0)
    if tuple(buffer.shape) != shape:
        buffer = np.empty(shape)
    for i, name in enumerate(names):
        buffer[:, i] = fields[name][r0:r1, c0:c1]
    kept: np.ndarray = ~np.isnan(buffer).all(axis=2)  # (rows x fields): runs with a number
    in_group: list[int] = []
    for i, name in enumerate(names):
        if not kept[:, i].any():
            stats.empty += 1
            codes[name].append(EMPTY)
            continue
        stored = narrowest(buffer[:, i])
        code = CODE_OF[stored.dtype]
        codes[name].append(code)
        if code == GROUPED:
            in_group.append(i)
        else:
            _store(folder, chunk_path(name, b, c), stored, previous, stats)
    if in_group:
        every = len(in_group) == len(names)
        stacked = buffer if every else buffer[:, in_group]
        data, index = group_runs(stacked, kept if every else kept[:, in_group])
        _store_group(folder, b, c, data, index, previous, stats)
    return buffer


def _store(
    folder: Path, rel: Path, stored: np.ndarray, previous: Path | None, stats: WriteStats
) -> None:
    if share_or_write(folder, rel, previous, chunk_equals(stored), _saver(stored)):
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
        share_or_write(folder, rel, previous, chunk_equals(values), _saver(values))
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
