"""A field of a version written from its new sessions and the previous version's: an (n x T)
array whose sessions from `start` on are in memory (the build's new values) and whose earlier
ones are the previous version's, read only if asked (the monthly file of the year in progress,
the latest values of rows not priced since). An incremental build's fields, which the writer
(`tables.write_content`) reads like any other: the chunks before the first new one are linked
from the previous version unread."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from eqrisk.snapshot import chunks

if TYPE_CHECKING:  # a protocol: the model's kernels are not imported to read a version
    from eqrisk.model.run import MetricArray


class FieldSource(Protocol):
    """Where the sessions before the new ones are read: a version (`Snapshot.array`)."""

    def array(self, field: str) -> chunks.FieldArray: ...


class Spliced:
    """An (n x T) field whose sessions >= `start` are in memory (`tail`) and earlier ones are
    the previous version's (read only if asked: the monthly file of the year in progress, the
    latest values of rows not priced since)."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, tail: np.ndarray, start: int, before: chunks.FieldArray | None) -> None:
        self.tail, self.start, self.before = tail, start, before
        self.shape = (tail.shape[0], start + tail.shape[1])

    def __getitem__(self, key: Any) -> Any:
        rows, cols = key
        s = self.start
        if isinstance(cols, (int, np.integer)):
            t = int(cols) % self.shape[1]
            if t >= s:
                return self.tail[rows, t - s]
            return self._before()[rows, t]
        lo, hi, step = cols.indices(self.shape[1])
        if step != 1:
            raise IndexError("a spliced array takes unit-step slices")
        if lo >= s:
            return self.tail[rows, lo - s : hi - s]
        if hi <= s:
            return self._read_before(rows, lo, hi)
        # Both: the previous version's sessions read into the answer, the tail copied after.
        whole = self._read_before(rows, lo, s, more=hi - s)
        if whole.shape[-1] == hi - lo:
            whole[..., s - lo :] = self.tail[rows, 0 : hi - s]
            return whole
        return np.concatenate([whole, self.tail[rows, 0 : hi - s]], axis=-1)

    def __len__(self) -> int:
        return int(self.shape[0])

    def pick(self, rows: np.ndarray, cols: np.ndarray) -> list[float]:
        """The values at (rows[k], cols[k]): gathered from the tail at once, read one by one
        from the previous version before it (rows not priced since)."""
        values = [0.0] * len(rows)
        new = cols >= self.start
        picked = self.tail[rows[new], cols[new] - self.start]
        for k, v in zip(np.flatnonzero(new).tolist(), picked.tolist(), strict=True):
            values[k] = v
        for k in np.flatnonzero(~new).tolist():
            values[k] = float(self._before()[int(rows[k]), int(cols[k])])
        return values

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.asarray(self[:, 0 : self.shape[1]], dtype=np.float64)
        return whole if dtype is None else whole.astype(dtype)

    def _read_before(self, rows: Any, lo: int, hi: int, more: int = 0) -> np.ndarray:
        """Sessions [lo, hi) of `rows` from the previous version: for a slice of rows of a
        chunked field, copied chunk by chunk (the long table's monthly file reads a year of
        every row this way), into an array of `more` columns more (for the caller to fill);
        otherwise through the field's own indexing (no columns more)."""
        before = self._before()
        if not isinstance(before, chunks.ChunkedArray) or not isinstance(rows, slice):
            return np.asarray(before[rows, lo:hi], dtype=np.float64)
        r0, r1, step = rows.indices(self.shape[0])
        if step != 1:
            return np.asarray(before[rows, lo:hi], dtype=np.float64)
        out = np.empty((max(0, r1 - r0), max(0, hi - lo) + more))
        # each chunk's part straight from its file or group, no dense chunk made first
        before.span(r0, r1, lo, hi, out=out[:, : max(0, hi - lo)])
        return out

    def _before(self) -> chunks.FieldArray:
        if self.before is None:
            raise IndexError("sessions before the reused point are not available")
        return self.before


def splice(
    new: Mapping[str, np.ndarray],
    start: int,
    previous: FieldSource | None,
    stored: Mapping[str, str] | None = None,
) -> dict[str, Spliced]:
    """Each array of `new` (sessions `start`.. of its field) over the previous version's field
    (named `stored[name]` there, `name` by default; one it lacks, or no `previous`, has no
    sessions before `start`)."""
    out: dict[str, Spliced] = {}
    for name, values in new.items():
        before: chunks.FieldArray | None = None
        if previous is not None:
            try:
                before = previous.array((stored or {}).get(name, name))
            except KeyError:
                before = None
        out[name] = Spliced(values, start, before)
    return out


def as_arrays(fields: Mapping[str, Spliced]) -> Mapping[str, MetricArray]:
    """The spliced fields as the model's result holds its metrics (`MetricArray`: indexed,
    sliced and converted by `np.asarray` as one (n x T) array)."""
    return fields
