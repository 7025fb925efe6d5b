"""Files -> arrow tables of text cells, and the vectorised parsers that turn text cells into
numbers and dates while keeping the bad ones (so a stray text cell is reported, not a crash).
Shared by the price, master and share-count readers."""

from __future__ import annotations

import csv
import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from eqrisk.data.dates import parse_date_values
from eqrisk.data.ingest_report import IngestError

PRICE_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
NA_TOKENS = ["", "na", "n/a", "nan", "null", "none", "#n/a"]
NUMBER_RE = r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$"


@dataclass(frozen=True)
class InputLimits:
    """What an input file may hold (the defaults are the settings' defaults): a price outside
    [min_price, max_price] is no price (the row is rejected); a line or a cell longer than its
    limit ends the read at once (a file without newlines is never read whole)."""

    min_price: float = 1e-4
    max_price: float = 1e7
    max_line_bytes: int = 2**20
    max_cell_bytes: int = 2**16


def fill_null(values: Any, fill: Any) -> pa.Array[Any] | pa.ChunkedArray[Any]:
    """`pyarrow.compute.fill_null` with its result typed as the array it is (the stubs type
    compute results as `object`)."""
    filled: pa.Array[Any] | pa.ChunkedArray[Any] = pc.fill_null(values, fill)
    return filled


def norm_name(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def file_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise IngestError(
        f"{path}: unsupported file type; accepted: {', '.join(PRICE_SUFFIXES)} (by suffix)"
    )


def _too_long(path: Path, what: str, limit: int, setting: str) -> IngestError:
    return IngestError(
        f"{path}: {what} is longer than {limit:,} bytes (setting {setting}): not a table of "
        "prices; nothing read past it"
    )


def csv_header(path: Path, max_line_bytes: int = InputLimits.max_line_bytes) -> list[str]:
    """The header of a CSV file, read no further than `max_line_bytes` (IngestError beyond)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
            line = fh.readline(max_line_bytes + 1)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise IngestError(f"{path}: cannot be read: {exc}") from exc
    if len(line.encode("utf-8")) > max_line_bytes:
        raise _too_long(path, "the header line", max_line_bytes, "max_line_bytes")
    try:
        header = next(csv.reader([line]), None)
    except csv.Error as exc:
        raise IngestError(f"{path}: cannot be read: {exc}") from exc
    if not header or not any(h.strip() for h in header):
        raise IngestError(f"{path}: empty file (no header line)")
    return header


def read_table(
    path: Path,
    keep: Callable[[list[str]], list[bool]] | None = None,
    limits: InputLimits | None = None,
) -> tuple[pa.Table, list[tuple[int | None, str]]]:
    """The file as an arrow table (CSV: every column as text) and its malformed CSV lines.

    `keep(header) -> mask` may leave columns out of a CSV read (they are never parsed). A CSV is
    read in blocks of `limits.max_line_bytes`: a line longer than that (a file without newlines)
    is an IngestError as soon as its first block is read; so is a cell longer than
    `limits.max_cell_bytes`."""
    limits = limits or InputLimits()
    if not path.exists():
        raise IngestError(f"{path}: no such file")
    if file_kind(path) == "parquet":
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise IngestError(f"{path}: cannot be read as Parquet: {exc}") from exc
        # a pandas index saved as a column is no data
        keep_cols = [n for n in table.column_names if not str(n).startswith("__index_level_")]
        return table.select(keep_cols), []
    names = csv_header(path, limits.max_line_bytes)
    # Unique internal names (a header may repeat a name); the real ones are restored below.
    internal = [f"c{i}" for i in range(len(names))]
    mask = keep(names) if keep is not None else [True] * len(names)
    wanted = [c for c, k in zip(internal, mask, strict=True) if k]
    bad_lines: list[tuple[int | None, str]] = []

    def handler(row: Any) -> Literal["skip"]:
        bad_lines.append((row.number, row.text))
        return "skip"

    def read(use_threads: bool) -> pa.Table:
        return pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(
                column_names=internal,
                skip_rows=1,
                use_threads=use_threads,
                block_size=limits.max_line_bytes,
            ),
            parse_options=pcsv.ParseOptions(invalid_row_handler=handler),
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(internal, pa.string()),
                strings_can_be_null=False,
                include_columns=wanted,
            ),
        )

    try:
        table = read(True)
        if bad_lines:  # line numbers are only known on a single-threaded read
            bad_lines.clear()
            table = read(False)
    except (OSError, pa.ArrowException) as exc:
        if "straddles" in str(exc):  # no line end within one block
            raise _too_long(path, "a line", limits.max_line_bytes, "max_line_bytes") from None
        raise IngestError(f"{path}: cannot be read as CSV: {exc}") from exc
    kept = [n for n, k in zip(names, mask, strict=True) if k]
    _check_cells(path, table, kept, limits.max_cell_bytes)
    return table.rename_columns(kept), bad_lines


def _check_cells(path: Path, table: pa.Table, names: list[str], limit: int) -> None:
    """IngestError naming the first cell longer than `limit` bytes (text columns)."""
    for name, column in zip(names, table.columns, strict=True):
        if column.num_chunks == 0 or not pa.types.is_string(column.type):
            continue
        lengths = fill_null(pc.binary_length(column), 0)
        if (pc.max(lengths).as_py() or 0) > limit:
            row = int(np.argmax(lengths.to_numpy() > limit))
            raise _too_long(path, f"column {name!r}, data row {row + 1}", limit, "max_cell_bytes")


def string_like(arr: pa.ChunkedArray[Any]) -> pa.ChunkedArray[Any]:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        arr = arr.cast(pa.string())
    return arr


def parse_numeric(arr: pa.ChunkedArray[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values with NaN where missing or bad, missing mask, bad mask) of a column."""
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        values = fill_null(arr.cast(pa.float64()), np.nan).to_numpy()
        missing = np.isnan(values)
        bad = np.isinf(values)
        values = np.where(bad, np.nan, values)
        return values, missing, bad
    text = pc.utf8_trim_whitespace(string_like(arr))
    missing_arr = pc.or_(
        pc.is_null(text), pc.is_in(pc.utf8_lower(text), value_set=pa.array(NA_TOKENS))
    )
    missing = fill_null(missing_arr, True).to_numpy(zero_copy_only=False)
    usable = pc.if_else(missing_arr, pa.scalar(None, pa.string()), text)
    try:  # fast path: every present cell parses
        values = fill_null(usable.cast(pa.float64()), np.nan).to_numpy()
        if np.isfinite(values[~missing]).all():
            return values, missing, np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        pass
    valid = fill_null(pc.match_substring_regex(text, NUMBER_RE), False)
    values = fill_null(
        pc.if_else(valid, text, pa.scalar(None, pa.string())).cast(pa.float64()), np.nan
    ).to_numpy()
    valid_np = valid.to_numpy(zero_copy_only=False) & np.isfinite(values)
    values = np.where(valid_np, values, np.nan)
    bad = ~valid_np & ~missing
    return values, missing, bad


def parse_dates(
    arr: pa.ChunkedArray[Any], date_format: str | None = None, *, source: str = "dates"
) -> tuple[np.ndarray, np.ndarray]:
    """(datetime64[ns] dates with NaT where bad, the raw text of each cell) of a date column.

    Text dates are read with one format for the whole column (`dates.parse_date_values`):
    `date_format`, else the one the column's values admit; DateFormatError when they admit
    none or several."""
    t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        if pa.types.is_date(t):
            arr = arr.cast(pa.timestamp("s"))
        series = arr.to_pandas()
        if getattr(series.dt, "tz", None) is not None:
            series = series.dt.tz_localize(None)
        dates = series.dt.normalize().to_numpy().astype("datetime64[ns]")
        return dates, np.asarray(series.astype(str).to_numpy(), dtype=object)
    encoded = pc.utf8_trim_whitespace(string_like(arr)).combine_chunks().dictionary_encode()
    indices = fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    uniq = np.asarray([*encoded.dictionary.to_pylist(), ""], dtype=object)
    parsed = np.append(
        parse_date_values(uniq[:-1].tolist(), date_format, source=source),
        np.datetime64("NaT", "ns"),
    )
    return parsed[indices], uniq[indices]
