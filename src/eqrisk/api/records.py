"""JSON arrays of records (`[{"name": value, ...}, ...]`) written without a Python object per
record: the portfolio answer's positions (up to 5,000 rows of seven fields, twice with a
benchmark).

Each column is formatted once by orjson (a numeric column in one call from its buffer, a text
column as one list, a coded column once per distinct value), the cells found in that text
(commas between numbers; `writer_kernels.split_elements` between strings), and a numba kernel
without the GIL lays the records out (`writer_kernels.lay_out_records`). The bytes are orjson's
for the list of dicts, as `writers.json_rows` writes them; the difference is where they go: into
buffers each work thread keeps and reuses (a fresh megabyte costs its page faults on this kind
of VM, more than the layout), returned as views that the caller splices into the answer at once
(`splice`), before the thread writes again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from eqrisk.api.writer_kernels import COMMA, SLACK, lay_out_records, split_elements

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_local = threading.local()


@dataclass(frozen=True)
class Coded:
    """A column of a few distinct values: `values[codes[i]]` is row i's (each value formatted
    once)."""

    codes: np.ndarray
    values: Sequence[Any]

    def __len__(self) -> int:
        return len(self.codes)


Column = np.ndarray | Sequence[str] | Coded


def _buffer(name: str, size: int, keep: int = 0) -> np.ndarray:
    """This thread's buffer `name` of at least `size` bytes (kept; grown by half again at
    least, its first `keep` bytes copied over)."""
    buf: np.ndarray | None = getattr(_local, name, None)
    if buf is None or len(buf) < size:
        grown = np.zeros(max(size, 3 * len(buf) // 2 if buf is not None else 0), dtype=np.uint8)
        if buf is not None and keep:
            grown[:keep] = buf[:keep]
        buf = grown
        setattr(_local, name, buf)
    return buf


def _cells(col: Column, n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The column's text and the bounds of its n cells in it."""
    if isinstance(col, Coded):
        pieces = [orjson.dumps(v) for v in col.values]
        offsets = np.cumsum([0, *map(len, pieces)], dtype=np.int64)
        codes = np.asarray(col.codes, dtype=np.int64)
        return b"".join(pieces), offsets[codes], offsets[codes + 1]
    if isinstance(col, np.ndarray) and col.dtype.kind in "fiu":
        text = orjson.dumps(np.ascontiguousarray(col), option=_NUMPY)
        commas = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == COMMA)
        starts = np.concatenate(([1], commas + 1))
        ends = np.concatenate((commas, [len(text) - 1]))
    else:
        text = orjson.dumps(list(col))
        starts, ends = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        found = split_elements(
            np.frombuffer(text, dtype=np.uint8), 1, len(text) - 1, COMMA, True, starts, ends
        )
        if found != n:
            raise RuntimeError(f"text column holds {found} cells, expected {n}")
    if len(starts) != n:
        raise RuntimeError(f"column holds {len(starts)} cells, expected {n}")
    return text, starts, ends


def records(tables: Sequence[Mapping[str, Column]]) -> list[memoryview]:
    """Each table (columns of one length) as the bytes orjson writes for its list of row
    dicts, as views into this thread's output buffer: valid until the thread calls again."""
    laid: list[tuple[int, int]] = []
    out = _buffer("out", 1)
    pos = 0
    for table in tables:
        lengths = {len(col) for col in table.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        n = lengths.pop()
        if n == 0:
            laid.append((-1, -1))
            continue
        texts, starts, ends = [], [], []
        base = cell_bytes = 0
        for col in table.values():
            text, s, e = _cells(col, n)
            texts.append(text)
            starts.append(s + base)
            ends.append(e + base)
            base += len(text)
            cell_bytes += int((e - s).sum())
        src = _buffer("src", base + SLACK)
        at = 0
        for text in texts:
            src[at : at + len(text)] = np.frombuffer(text, dtype=np.uint8)
            at += len(text)
        keys = [orjson.dumps(name) + b":" for name in table]
        pieces = [(b"{" if c == 0 else b",") + key for c, key in enumerate(keys)]
        lit = np.frombuffer(b"".join(pieces) + bytes(SLACK), dtype=np.uint8)
        lit_bounds = np.cumsum([0, *map(len, pieces)], dtype=np.int64)
        room = cell_bytes + n * (int(lit_bounds[-1]) + 2) + 2  # the exact size, at most
        out = _buffer("out", pos + room + SLACK, keep=pos)
        start = pos
        pos = lay_out_records(src, np.vstack(starts), np.vstack(ends), lit, lit_bounds, out, pos)
        if pos > start + room:
            raise RuntimeError(f"wrote {pos - start} bytes into room for {room}")
        laid.append((start, pos))
    view = out.data  # a memoryview of the buffer
    return [view[a:b] if a >= 0 else memoryview(b"[]") for a, b in laid]


_MARK = b"\x00%d\x00"  # orjson escapes a NUL in a string: never in its output


def splice_marks(k: int) -> list[orjson.Fragment]:
    """k placeholders to put in a document where `splice` puts the k parts."""
    return [orjson.Fragment(_MARK % i) for i in range(k)]


def splice(text: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
    """`text` (orjson's, holding each of `splice_marks(len(parts))` once, in order) with the
    parts in their places: one copy of the answer."""
    view = memoryview(text)  # slices of the text, not copies of what follows each mark
    pieces: list[bytes | memoryview] = []
    at = 0
    for i, part in enumerate(parts):
        mark = _MARK % i
        found = text.find(mark, at)
        if found < 0:
            raise ValueError(f"placeholder {i} is not in the text")
        pieces += [view[at:found], part]
        at = found + len(mark)
    pieces.append(view[at:])
    return b"".join(pieces)


def coded(values: Sequence[str]) -> Coded:
    """A text column of few distinct values (the reasons a ticker was not used) as codes."""
    distinct = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(distinct)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    return Coded(codes, distinct)


def warm_up() -> None:
    """Compiles (or loads from numba's cache) the kernel now, at startup, and checks that it
    writes what orjson writes."""
    table: dict[str, Column] = {"t": ["a", 'b"'], "x": np.array([0.5, np.nan])}
    table["c"] = Coded(np.array([1, 0]), ["u", None])
    want = orjson.dumps([{"t": "a", "x": 0.5, "c": None}, {"t": 'b"', "x": None, "c": "u"}])
    if bytes(records([table])[0]) != want:
        raise RuntimeError("the records writer does not write what orjson writes")
