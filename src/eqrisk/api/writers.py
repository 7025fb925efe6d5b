"""The writers of tabular answers: JSON rows, JSON columns and CSV, formatted a column at a time.

A row answer used to be a Python dict per row handed to orjson (and pyarrow's CSV writer for
CSV): most of the time went into building and walking those objects. Here each column is
formatted once, in bulk, by orjson: a numeric column (float64, integer, bool) in one call
straight from its buffer, a date or text column once per distinct value (a symbol or a date
repeats across the rows of a multi-symbol answer). A numba kernel without the GIL then lays
the rows out, cutting the numbers out of orjson's array text itself, eight bytes at a time.

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
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from eqrisk.api.writer_kernels import (
    BOUNDS,
    COMMA,
    NEWLINE,
    QUOTE,
    SCAN,
    SLACK,
    lay_out_rows,
    split_elements,
)

Columns = Mapping[str, Sequence[Any] | np.ndarray]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
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


def _split(
    text: bytes, lo: int, hi: int, sep: int, json: bool, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the n cells of text[lo:hi]; a different count is a bug, not a client error."""
    starts, ends = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    found = split_elements(np.frombuffer(text, dtype=np.uint8), lo, hi, sep, json, starts, ends)
    if found != n:
        raise RuntimeError(f"column text holds {found} cells, expected {n}")
    return starts, ends


def _column_text(col: Sequence[Any] | np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The column's JSON array and the bounds of its cells in it."""
    text = json_array(col)
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


class _Plan:
    """What `lay_out_rows` lays out: the source bytes and, per column, how its cells are found
    there (scanned from a numeric column's orjson text, or given as bounds)."""

    def __init__(self, nrows: int) -> None:
        self.nrows = nrows
        self.source = _Source()
        self.kinds: list[int] = []
        self.cursors: list[int] = []
        self.slots: list[int] = []
        self.bounds: list[tuple[np.ndarray, np.ndarray]] = []
        self.inf_slots: list[int] = []
        self.inf_values: list[np.ndarray] = []
        self.brackets: list[int] = []  # closing brackets of scanned texts, made commas
        self.cell_bytes = 0  # at least the bytes of all cells

    def scan(self, text: bytes, values: np.ndarray | None) -> None:
        """A numeric column's orjson array text: the kernel finds the cells itself.
        `values`: the float column, where it holds an infinity (CSV writes inf, not null)."""
        base = self.source.add(text)
        self.kinds.append(SCAN)
        self.cursors.append(base + 1)
        self.slots.append(-1)
        self.brackets.append(base + len(text) - 1)
        self.cell_bytes += len(text)
        if values is not None and np.isinf(values).any():
            self.inf_slots.append(len(self.inf_values))
            self.inf_values.append(values)
        else:
            self.inf_slots.append(-1)

    def cells(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """A column's cells as bounds in the source."""
        self.kinds.append(BOUNDS)
        self.cursors.append(0)
        self.slots.append(len(self.bounds))
        self.bounds.append((starts, ends))
        self.inf_slots.append(-1)
        self.cell_bytes += int((ends - starts).sum())

    def source_array(self) -> np.ndarray:
        """The source bytes, writable, with the scanned texts' brackets made commas and
        `SLACK` bytes after the end."""
        src = np.empty(self.source.size + SLACK, dtype=np.uint8)
        src[self.source.size :] = 0
        pos = 0
        for part in self.source.parts:
            src[pos : pos + len(part)] = np.frombuffer(part, dtype=np.uint8)
            pos += len(part)
        src[np.array(self.brackets, dtype=np.int64)] = COMMA
        return src


def _dictionary(
    col: Sequence[Any] | np.ndarray,
) -> tuple[np.ndarray, Sequence[Any] | np.ndarray] | None:
    """(codes, distinct values) of a date or text column, whose cells are then formatted once
    per distinct value (a symbol, a sector, a date repeat across rows); None for any other
    column. Values written differently never share a code: datetime64 values are compared
    as their int64; objects only when every distinct value is a `str`, or every one a
    `datetime.date` (a str never equals a non-str, nor a date a datetime, whereas 1, 1.0 and
    True are one value to a hash table: such a column is not coded). Null (None, NaN) is one
    more distinct value, last."""
    if isinstance(col, np.ndarray) and col.dtype.kind == "M":
        codes, found = pd.factorize(col.view(np.int64))  # NaT is one more int64
        return codes, found.view(col.dtype)
    if isinstance(col, np.ndarray) and col.dtype.kind not in "OU":
        return None
    values = np.empty(len(col), dtype=object)
    try:
        values[:] = col
        codes, found = _factorize(values)
    except (TypeError, ValueError):  # nested or unhashable values: written a cell at a time
        return None
    distinct: list[Any] = found.tolist()
    kinds = set(map(type, distinct))
    if not (kinds <= {str} or kinds <= {dt.date}):
        return None
    if len(codes) and codes.min() < 0:
        codes = np.where(codes < 0, len(distinct), codes)
        distinct.append(None)
    return codes, distinct


RUN_PROBE = 1024  # leading values looked at to decide whether a column comes in runs


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`pandas.factorize` of an object column; a column in runs of equal values (the symbol
    or the sector of a multi-symbol answer, one run per symbol) is factorized by the first
    value of each run, the codes repeated along the runs: comparing neighbours costs a third
    of hashing every value. Equal neighbours are one run even where they would be written
    differently (1 and 1.0): the caller keeps a coding only when every distinct value is a
    `str`, or every one a `datetime.date`, which equal nothing of another kind."""
    n = len(values)
    probe = values[: RUN_PROBE + 1]
    if n < 2 or np.count_nonzero(probe[1:] != probe[:-1]) * 4 > len(probe):
        return pd.factorize(values)
    change = values[1:] != values[:-1]
    if not isinstance(change, np.ndarray) or change.dtype != np.bool_:
        raise TypeError("values that do not compare one by one")
    heads = np.concatenate(([0], np.flatnonzero(change) + 1))
    if len(heads) * 4 > n:
        return pd.factorize(values)
    head_codes, found = pd.factorize(values[heads])
    return np.repeat(head_codes, np.diff(np.append(heads, n))), found


def _plan_column(plan: _Plan, col: Sequence[Any] | np.ndarray, csv: bool) -> None:
    """Formats one column into the plan: numbers as one orjson array text the kernel scans,
    dates and text once per distinct value, anything else a cell at a time."""
    if _numeric(col):
        values = np.ascontiguousarray(col)
        infinite = values if csv and values.dtype.kind == "f" else None
        plan.scan(orjson.dumps(values, option=_NUMPY), infinite)
        return
    coded = _dictionary(col)
    if coded is not None and not (csv and _csv_kind(col) == "arrow"):
        codes, distinct = coded
        starts, ends = (
            _csv_cells(plan.source, distinct) if csv else _json_cells(plan.source, distinct)
        )
        plan.cells(starts[codes], ends[codes])
        return
    plan.cells(*(_csv_cells(plan.source, col) if csv else _json_cells(plan.source, col)))


def _write_rows(
    columns: Columns,
    csv: bool,
    before: list[bytes],
    row_end: bytes,
    row_sep: bytes,
    *,
    prefix: bytes,
    suffix: bytes,
) -> bytes:
    """`prefix`, the rows, `suffix`: `before[c]` ahead of each cell of column c, `row_end`
    after each row, `row_sep` between rows. The columns are formatted here (GIL held, a
    column per orjson call), the rows laid out by `lay_out_rows` (GIL released)."""
    nrows = _rows_of(columns)
    if nrows == 0 or not columns:
        return prefix + suffix
    plan = _Plan(nrows)
    for col in columns.values():
        _plan_column(plan, col, csv)
    src = plan.source_array()
    starts = np.empty((len(plan.bounds), nrows), dtype=np.int64)
    ends = np.empty((len(plan.bounds), nrows), dtype=np.int64)
    for k, (s, e) in enumerate(plan.bounds):
        starts[k] = s
        ends[k] = e
    values = np.empty((len(plan.inf_values), nrows), dtype=np.float64)
    for k, v in enumerate(plan.inf_values):
        values[k] = v
    pieces = [*before, row_end, row_sep]
    lit = np.frombuffer(b"".join(pieces) + bytes(SLACK), dtype=np.uint8)
    lit_bounds = np.cumsum([0, *(len(p) for p in pieces)], dtype=np.int64)
    per_row = sum(len(p) for p in before) + len(row_end)
    room = plan.cell_bytes + nrows * per_row + (nrows - 1) * len(row_sep)
    out = np.empty(len(prefix) + room + len(suffix) + SLACK, dtype=np.uint8)
    out[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    pos = lay_out_rows(
        src,
        nrows,
        np.array(plan.kinds, dtype=np.int64),
        np.array(plan.cursors, dtype=np.int64),
        np.array(plan.slots, dtype=np.int64),
        starts,
        ends,
        np.array(plan.inf_slots, dtype=np.int64),
        values,
        lit,
        lit_bounds,
        csv,
        out,
        len(prefix),
    )
    if pos > len(prefix) + room:
        raise RuntimeError(f"wrote {pos - len(prefix)} bytes into room for {room}")
    out[pos : pos + len(suffix)] = np.frombuffer(suffix, dtype=np.uint8)
    return out[: pos + len(suffix)].tobytes()


def _rows_of(columns: Columns) -> int:
    lengths = {len(col) for col in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of different lengths: {sorted(lengths)}")
    return lengths.pop() if lengths else 0


def json_rows(columns: Columns, *, prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    """`[{"name": value, ...}, ...]`, the bytes orjson writes for the list of row dicts,
    between `prefix` and `suffix` (an envelope around the rows costs no copy)."""
    keys = [orjson.dumps(name) + b":" for name in columns]
    before = [(b"{" if c == 0 else b",") + key for c, key in enumerate(keys)]
    return _write_rows(
        columns, False, before, b"}", b",", prefix=prefix + b"[", suffix=b"]" + suffix
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
    before = [b"" if c == 0 else b"," for c in range(len(columns))]
    head = prefix + csv_header(list(columns))
    return _write_rows(columns, True, before, b"\n", b"", prefix=head, suffix=b"")


def warm_up() -> None:
    """Compiles (or loads from numba's cache) the kernels now, at startup: compiling holds the
    GIL for a second or more, which the first large answer would otherwise cost the loop."""
    table: Columns = {"s": ["a", None], "x": np.array([0.5, np.nan])}
    if json_rows(table) != b'[{"s":"a","x":0.5},{"s":null,"x":null}]':
        raise RuntimeError("the JSON writer does not write what orjson writes")
    if csv_rows(table) != b'"s","x"\n"a",0.5\n,\n':
        raise RuntimeError("the CSV writer does not write what pyarrow wrote")
