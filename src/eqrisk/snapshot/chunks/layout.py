"""Where a chunk lives in a version folder (own files, group files and their runs index), the
order of fields in a group file, the narrowest dtype a chunk is stored in, and the files a
manifest's `arrays` block implies (what opening a version checks)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eqrisk.snapshot.chunks.grid import (
    CODES,
    DENSE_GROUPS,
    EMPTY,
    GROUP_DIR,
    GROUPED,
    RUNS,
    ChunkGrid,
)

SPARSE_LAST = ("l2_sec_er", "l2_sec_hr", "l3_sec_er", "l3_sec_hr", "l3_sub_er", "l3_sub_hr")


def group_order(name: str) -> tuple[int, str]:
    """Order of the fields in a group file (layout chunks-2; chunks-1: alphabetical)."""
    return (SPARSE_LAST.index(name) + 1 if name in SPARSE_LAST else 0, name)


def chunk_path(name: str, b: int, c: int) -> Path:
    """Path of one field's own chunk file (a narrow dtype) inside a version folder."""
    return Path(f"arrays/{name}/{b}.{c}.npy")  # one Path built, not three


def group_path(b: int, c: int) -> Path:
    """Path of the group file of (block b, chunk c): its float64 fields, (rows x fields x L)."""
    return Path(f"arrays/{GROUP_DIR}/{b}.{c}.npy")


def runs_path(b: int, c: int) -> Path:
    """Path of the runs index of group file (b, c): (rows x fields) int32, -1 = not stored."""
    return Path(f"arrays/{GROUP_DIR}/{b}.{c}.runs.npy")


def group_runs(
    stacked: np.ndarray, kept: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A (rows x fields x L) group as (runs x L) float64, the runs holding a number in
    row-major order, and the (rows x fields) int32 index of each run (-1: all NaN). `kept`:
    the (rows x fields) runs holding a number, when the caller knows them already."""
    if kept is None:
        kept = ~np.isnan(stacked).all(axis=2)
    index = np.full(kept.shape, -1, dtype=np.int32)
    runs = int(kept.sum())
    index[kept] = np.arange(runs, dtype=np.int32)
    if runs == kept.size and stacked.flags.c_contiguous:  # every run: the group as it is
        return stacked.reshape(runs, stacked.shape[2]), index
    return np.ascontiguousarray(stacked[kept]), index


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` and `b` hold the same bits (shape, dtype and every byte: NaN payloads and
    -0.0 against 0.0 differ), read in place: each element viewed as the unsigned integer of
    its width, so no copy of either array is made (the only temporary is one bool per
    element)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.hasobject:
        return a.tobytes() == b.tobytes()  # the references: no bits of their own to compare
    unsigned = _UNSIGNED.get(a.dtype.itemsize)
    if unsigned is None:  # another width (complex, a record): its bytes, copied only if strided
        a, b = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
        unsigned = np.uint8
    return bool(np.array_equal(a.view(unsigned), b.view(unsigned)))


def _converts_back(values: np.ndarray, narrow: np.ndarray) -> bool:
    """Whether `narrow.astype(float64)` has the bits of `values` (float64), without making that
    copy. Off NaN, a conversion to float64 keeps the sign, so equal values are equal bits but
    for a -0.0 an unsigned integer gives back as 0.0; a NaN's payload may change on the way,
    so the NaN elements alone are converted back and compared bit for bit."""
    with np.errstate(invalid="ignore"):
        equal = values == narrow
    if narrow.dtype.kind == "u":  # `values` is finite here: no NaN to look at
        return bool(equal.all()) and not bool(np.signbit(values).any())
    nan = np.isnan(values)
    if not bool((equal | nan).all()):
        return False
    if not bool(nan.any()):
        return True
    back = narrow[nan].astype(np.float64)
    return same_bits(back, values[nan])


def _fails_on(probe: np.ndarray, dtype: np.dtype[Any]) -> bool:
    """Whether some element of `probe` (a few elements of a float64 chunk) proves that the
    chunk does not convert to `dtype` and back (`narrowest`'s test, element by element): a
    finite number that changes on the way, a negative zero or a non-finite number for an
    unsigned dtype. False proves nothing: the whole chunk is tested then."""
    finite = np.isfinite(probe)
    with np.errstate(invalid="ignore", over="ignore"):
        changed = probe.astype(dtype) != probe
    if dtype.kind == "u":
        return not bool(finite.all()) or bool((changed | np.signbit(probe)).any())
    return bool((changed & finite).any())


def narrowest(values: np.ndarray) -> np.ndarray:
    """`values` (float64) in the narrowest dtype that converts back to the same bits."""
    if values.dtype != np.float64:
        return values
    # A few elements first (a float64 result's, most chunks): one that cannot convert rules
    # the dtype out without converting the chunk.
    probe = values[tuple(slice(None, None, max(1, n // 8)) for n in values.shape)]
    for code in ("B", "H", "f"):
        dtype = CODES[code]
        if _fails_on(probe, dtype):
            continue
        if dtype.kind == "u" and not np.isfinite(values).all():
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            narrow = values.astype(dtype)
        if _converts_back(values, narrow):
            return narrow
    return values


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
