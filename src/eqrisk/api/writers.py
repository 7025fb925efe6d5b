"""The writers of tabular answers: JSON rows, JSON columns and CSV, formatted a column at a time.

A row answer used to be a Python dict per row handed to orjson (and pyarrow's CSV writer for
CSV): most of the time went into building and walking those objects. Here each column is
formatted once, in bulk, by orjson (numpy float64, integer and bool columns straight from
their buffers; dates and text through one list each); the column texts are cut into cells
(numpy for numbers, a numba scan that knows JSON strings for text) and a numba kernel without
the GIL lays the rows out from them.

The text of every value is orjson's, as before: floats in the shortest form that parses back
to the identical float64, NaN as null, dates as YYYY-MM-DD. CSV cells follow pyarrow's CSV
writer, which wrote them before: text quoted (a quote doubled), dates bare, null an empty
cell, an integral float without `.0`, infinity `inf`; only the switch to exponent notation
differs (orjson writes 1e-6 where pyarrow wrote 0.000001, 10000000000 where it wrote 1e+10),
never the value.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv

from eqrisk.api.writer_kernels import (
    COMMA,
    NEWLINE,
    QUOTE,
    assemble_rows,
    empty_bounds,
    split_elements,
)

Columns = Mapping[str, Sequence[Any] | np.ndarray]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
BLOCK_CELLS = 32_768  # float values per orjson call (about 1 ms with the GIL held)
_INF, _MINUS_INF = b"inf", b"-inf"


def _numeric(col: Sequence[Any] | np.ndarray) -> bool:
    """A float64, integer or bool array, which orjson formats from its buffer exactly as it
    formats the Python numbers of `tolist()`."""
    return (
        isinstance(col, np.ndarray)
        and col.dtype.isnative
        and (col.dtype == np.float64 or col.dtype.kind in "iub")
    )


def json_array(col: Sequence[Any] | np.ndarray) -> bytes:
    """The column as one JSON array, each value as orjson writes it in a row dict: numeric
    arrays from their buffers, anything else through `tolist()`."""
    if isinstance(col, np.ndarray):
        if _numeric(col):
            return orjson.dumps(np.ascontiguousarray(col), option=_NUMPY)
        return orjson.dumps(col.tolist(), option=_NUMPY)
    return orjson.dumps(list(col), option=_NUMPY)


def arrow_array(col: Sequence[Any] | np.ndarray) -> pa.Array[Any]:
    """The column typed for Arrow (Parquet, and CSV cells the writer here does not format):
    float64 with NaN as null, datetimes as date32, anything else as pyarrow infers it."""
    if isinstance(col, np.ndarray) and col.dtype.kind == "f":
        # NaN -> null through an explicit mask (pyarrow's from_pandas path is ~1000x slower).
        return pa.array(col, type=pa.float64(), mask=np.isnan(col))
    if isinstance(col, np.ndarray) and col.dtype.kind == "M":
        return pa.array(col.astype("datetime64[D]"), type=pa.date32())
    inferred: pa.Array[Any] = pa.array(col.tolist() if isinstance(col, np.ndarray) else list(col))
    return inferred


def arrow_table(columns: Columns) -> pa.Table:
    return pa.table({name: arrow_array(col) for name, col in columns.items()})


class _Source:
    """The bytes every cell points into: the column texts, then replacement cells, appended
    as they come; `src` joins them once for the kernel."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> int:
        """Appends `data`; returns its offset."""
        offset = self.size
        self.parts.append(data)
        self.size += len(data)
        return offset

    def joined(self) -> np.ndarray:
        return np.frombuffer(b"".join(self.parts), dtype=np.uint8)


def _split(
    text: bytes, lo: int, hi: int, sep: int, json: bool, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the n cells of text[lo:hi]; a different count is a bug, not a client error."""
    starts, ends = empty_bounds(n)
    found = split_elements(np.frombuffer(text, dtype=np.uint8), lo, hi, sep, json, starts, ends)
    if found != n:
        raise RuntimeError(f"column text holds {found} cells, expected {n}")
    return starts, ends


def _column_text(col: Sequence[Any] | np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The column's JSON array and the bounds of its cells in it."""
    text = json_array(col)
    if _numeric(col):  # no strings, no nesting: every comma separates two cells
        commas = np.flatnonzero(np.frombuffer(text, dtype=np.uint8)[1:-1] == COMMA) + 1
        if len(col) and len(commas) != len(col) - 1:
            raise RuntimeError(f"column text holds {len(commas) + 1} cells, expected {len(col)}")
        starts = np.concatenate(([1], commas + 1)) if len(col) else commas
        ends = np.concatenate((commas, [len(text) - 1])) if len(col) else commas
        return text, starts, ends
    starts, ends = _split(text, 1, len(text) - 1, COMMA, True, len(col))
    return text, starts, ends


def _json_cells(source: _Source, col: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    text, starts, ends = _column_text(col)
    base = source.add(text)
    return starts + base, ends + base


def _first_value(col: Sequence[Any] | np.ndarray) -> Any:
    for value in col:
        if value is not None:
            return value
    return None


def _csv_kind(col: Sequence[Any] | np.ndarray) -> str:
    """How CSV cells come from the column's JSON text: "json" (numbers, bools, quoted text
    as it is), "date" (quotes dropped) or "arrow" (a type only pyarrow formats as before)."""
    if isinstance(col, np.ndarray) and col.dtype.kind in "fiubU":
        return "json"
    if isinstance(col, np.ndarray) and col.dtype.kind == "M":
        return "date"
    first = _first_value(col)
    if isinstance(first, dt.datetime):
        return "arrow"
    if isinstance(first, dt.date):
        return "date"
    if first is None or isinstance(first, str | bool | int | float):
        return "json"
    return "arrow"


def _csv_cells(source: _Source, col: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSV cells of a column, as pyarrow's CSV writer (quoting "needed") writes them."""
    kind = _csv_kind(col)
    if kind == "arrow":
        sink = io.BytesIO()
        options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
        pacsv.write_csv(pa.table({"c": arrow_array(col)}), sink, options)
        text = sink.getvalue()
        base = source.add(text)
        starts, ends = _split(text, 0, len(text), NEWLINE, False, len(col))
        return starts + base, ends + base
    if isinstance(col, np.ndarray) and col.dtype.kind == "M":
        col = col.astype("datetime64[D]")  # the CSV cell of a datetime is its date
    text, starts, ends = _column_text(col)
    arr = np.frombuffer(text, dtype=np.uint8)
    first = arr[starts]
    length = ends - starts
    quoted = first == QUOTE
    ends = np.where((length == 4) & (first == ord("n")), starts, ends)  # null: an empty cell
    replaced: dict[int, bytes] = {}
    if kind == "date":
        starts = np.where(quoted, starts + 1, starts)
        ends = np.where(quoted, ends - 1, ends)
    else:
        # 37.0 -> 37, as pyarrow writes an integral double (orjson never writes 1.0e5).
        tail = np.maximum(ends - 2, 0)
        integral = ~quoted & (length >= 3) & (arr[tail] == ord(".")) & (arr[tail + 1] == ord("0"))
        ends = np.where(integral, ends - 2, ends)
        replaced.update(_requoted(arr, col, starts, ends, quoted))
    if isinstance(col, np.ndarray) and col.dtype.kind == "f":
        for i in np.flatnonzero(np.isinf(col)).tolist():  # null in JSON; pyarrow wrote inf
            replaced[i] = _INF if col[i] > 0 else _MINUS_INF
    base = source.add(text)
    starts, ends = starts + base, ends + base
    for i, cell in replaced.items():
        starts[i] = source.add(cell)
        ends[i] = starts[i] + len(cell)
    return starts, ends


def _requoted(
    arr: np.ndarray,
    col: Sequence[Any] | np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    quoted: np.ndarray,
) -> dict[int, bytes]:
    """A JSON string without a backslash is its own CSV cell (`"text"`); one with escapes
    (a quote, a newline, a control character) is quoted again the CSV way."""
    backslashes = np.flatnonzero(arr == ord("\\"))
    if not len(backslashes):
        return {}
    owner = np.searchsorted(starts, backslashes, side="right") - 1
    inside = (owner >= 0) & (backslashes < ends[np.maximum(owner, 0)])
    rows = np.unique(owner[inside])
    rows = rows[quoted[rows]]
    return {i: ('"' + str(col[i]).replace('"', '""') + '"').encode() for i in rows.tolist()}


def _is_float64(col: Sequence[Any] | np.ndarray) -> bool:
    return isinstance(col, np.ndarray) and col.dtype == np.float64 and col.dtype.isnative


def _float_cells(
    source: _Source, cols: list[np.ndarray], csv: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cells of float64 columns, formatted by one orjson call over all of them (a call per
    column costs more in Python than in formatting when a column has a few thousand rows).
    CSV: NaN an empty cell, infinity inf / -inf, an integral value without its `.0`."""
    n = len(cols[0])
    values = np.concatenate(cols) if len(cols) > 1 else cols[0]
    text, starts, ends = _column_text(values)
    replaced: dict[int, bytes] = {}
    if csv:
        arr = np.frombuffer(text, dtype=np.uint8)
        ends = np.where(np.isnan(values) | np.isinf(values), starts, ends)
        tail = np.maximum(ends - 2, 0)
        integral = (ends - starts >= 3) & (arr[tail] == ord(".")) & (arr[tail + 1] == ord("0"))
        ends = np.where(integral, ends - 2, ends)
        for i in np.flatnonzero(np.isinf(values)).tolist():  # null in JSON; pyarrow wrote inf
            replaced[i] = _INF if values[i] > 0 else _MINUS_INF
    base = source.add(text)
    starts, ends = starts + base, ends + base
    for i, cell in replaced.items():
        starts[i] = source.add(cell)
        ends[i] = starts[i] + len(cell)
    return [(starts[k * n : (k + 1) * n], ends[k * n : (k + 1) * n]) for k in range(len(cols))]


def _float_blocks(cols: list[Sequence[Any] | np.ndarray]) -> list[list[int]]:
    """The float64 columns in blocks of about `BLOCK_CELLS` values: one orjson call per block
    holds the GIL about a millisecond, so an event loop waiting for it is not held up longer
    (one call over all the floats of an 8 MB answer held it 8 ms)."""
    blocks: list[list[int]] = []
    size = 0
    for k, col in enumerate(cols):
        if not _is_float64(col):
            continue
        if not blocks or size + len(col) > BLOCK_CELLS:
            blocks.append([])
            size = 0
        blocks[-1].append(k)
        size += len(col)
    return blocks


def _cells(source: _Source, columns: Columns, csv: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cells of every column, in column order: the float64 columns in one block, the
    others one at a time."""
    cols = list(columns.values())
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(cols)
    for block in _float_blocks(cols):
        cells = _float_cells(source, [np.asarray(cols[k]) for k in block], csv)
        for k, column_cells in zip(block, cells, strict=True):
            out[k] = column_cells
    for k, col in enumerate(cols):
        if out[k] is None:
            out[k] = _csv_cells(source, col) if csv else _json_cells(source, col)
    return [c for c in out if c is not None]


def _layout(
    source: _Source,
    cells: list[tuple[np.ndarray, np.ndarray]],
    before: list[bytes],
    row_end: bytes,
    row_sep: bytes,
    nrows: int,
    *,
    prefix: bytes,
    suffix: bytes,
) -> bytes:
    """`prefix`, the rows, `suffix`: `before[c]` ahead of each cell of column c, `row_end`
    after each row, `row_sep` between rows."""
    if nrows == 0 or not cells:
        return prefix + suffix
    src = source.joined()
    starts = np.empty((nrows, len(cells)), dtype=np.int64)
    ends = np.empty((nrows, len(cells)), dtype=np.int64)
    for c, (s, e) in enumerate(cells):
        starts[:, c] = s
        ends[:, c] = e
    pieces = [*before, row_end, row_sep]
    lit = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    bounds = np.cumsum([0, *(len(p) for p in pieces)], dtype=np.int64)
    per_row = sum(len(p) for p in before) + len(row_end)
    body = int((ends - starts).sum()) + nrows * per_row + (nrows - 1) * len(row_sep)
    out = np.empty(len(prefix) + body + len(suffix), dtype=np.uint8)
    out[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    pos = assemble_rows(src, starts, ends, lit, bounds[:-1], bounds[1:], out, len(prefix))
    if pos != len(prefix) + body:
        raise RuntimeError(f"wrote {pos - len(prefix)} bytes of {body}")
    out[pos:] = np.frombuffer(suffix, dtype=np.uint8)
    return out.tobytes()


def _rows_of(columns: Columns) -> int:
    lengths = {len(col) for col in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of different lengths: {sorted(lengths)}")
    return lengths.pop() if lengths else 0


def json_rows(columns: Columns, *, prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    """`[{"name": value, ...}, ...]`, the bytes orjson writes for the list of row dicts,
    between `prefix` and `suffix` (an envelope around the rows costs no copy)."""
    nrows = _rows_of(columns)
    source = _Source()
    cells = _cells(source, columns, csv=False)
    keys = [orjson.dumps(name) + b":" for name in columns]
    before = [(b"{" if c == 0 else b",") + key for c, key in enumerate(keys)]
    return _layout(
        source, cells, before, b"}", b",", nrows, prefix=prefix + b"[", suffix=b"]" + suffix
    )


def json_columns(columns: Columns, *, prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    """`{"name": [values], ...}`: the values of `json_rows`, one array per column."""
    _rows_of(columns)
    parts = [orjson.dumps(name) + b":" + json_array(col) for name, col in columns.items()]
    return b"".join([prefix, b"{", b",".join(parts), b"}", suffix])


def csv_header(names: Sequence[str]) -> bytes:
    """The header row as pyarrow writes it: every name quoted."""
    return b",".join(('"' + name.replace('"', '""') + '"').encode() for name in names) + b"\n"


def csv_rows(columns: Columns, *, prefix: bytes = b"") -> bytes:
    """`prefix` (a comment line), a header row, then one line per row, each ending with a
    newline."""
    nrows = _rows_of(columns)
    source = _Source()
    cells = _cells(source, columns, csv=True)
    before = [b"" if c == 0 else b"," for c in range(len(cells))]
    head = prefix + csv_header(list(columns))
    return _layout(source, cells, before, b"\n", b"", nrows, prefix=head, suffix=b"")


def warm_up() -> None:
    """Compiles (or loads from numba's cache) the kernels now, at startup: compiling holds the
    GIL for a second or more, which the first large answer would otherwise cost the loop."""
    table: Columns = {"s": ["a", None], "x": np.array([0.5, np.nan])}
    if json_rows(table) != b'[{"s":"a","x":0.5},{"s":null,"x":null}]':
        raise RuntimeError("the JSON writer does not write what orjson writes")
    if csv_rows(table) != b'"s","x"\n"a",0.5\n,\n':
        raise RuntimeError("the CSV writer does not write what pyarrow wrote")
