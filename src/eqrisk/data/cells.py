"""Files -> arrow tables of text cells, and the vectorised parsers that turn text cells into
numbers and dates while keeping the bad ones (so a stray text cell is reported, not a crash).
Shared by the price, master and share-count readers."""

from __future__ import annotations

import csv
import gzip
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from eqrisk.data.ingest_report import IngestError

PRICE_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
NA_TOKENS = ["", "na", "n/a", "nan", "null", "none", "#n/a"]
NUMBER_RE = r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$"


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


def csv_header(path: Path) -> list[str]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh), None)
    except (OSError, UnicodeDecodeError, csv.Error, EOFError) as exc:
        raise IngestError(f"{path}: cannot be read: {exc}") from exc
    if not header or not any(h.strip() for h in header):
        raise IngestError(f"{path}: empty file (no header line)")
    return header


def read_table(
    path: Path, keep: Callable[[list[str]], list[bool]] | None = None
) -> tuple[pa.Table, list[tuple[int | None, str]]]:
    """The file as an arrow table (CSV: every column as text) and its malformed CSV lines.

    `keep(header) -> mask` may leave columns out of a CSV read (they are never parsed)."""
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
    names = csv_header(path)
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
                column_names=internal, skip_rows=1, use_threads=use_threads
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
        raise IngestError(f"{path}: cannot be read as CSV: {exc}") from exc
    return table.rename_columns([n for n, k in zip(names, mask, strict=True) if k]), bad_lines


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


def _parse_date_strings(uniq: np.ndarray) -> np.ndarray:
    """datetime64[ns] (NaT where unparseable or outside 1900-2200) of distinct date strings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parsed = pd.to_datetime(pd.Index(uniq), format="ISO8601", errors="coerce")
            if parsed.tz is not None:
                parsed = parsed.tz_localize(None)
            values = list(parsed)
        except (ValueError, TypeError):
            values = [pd.NaT] * len(uniq)
        for i, ts in enumerate(values):
            if ts is pd.NaT and uniq[i].strip().lower() not in NA_TOKENS:
                try:  # other spellings: 12/25/2020, Dec 25 2020, mixed time zones
                    ts = pd.Timestamp(uniq[i])
                    values[i] = ts.tz_localize(None) if ts.tz is not None else ts
                except (ValueError, TypeError, OverflowError):
                    pass
    out = np.full(len(uniq), np.datetime64("NaT"), dtype="datetime64[ns]")
    for i, ts in enumerate(values):
        if ts is not pd.NaT and ts is not None and 1900 <= ts.year <= 2200:
            out[i] = np.datetime64(ts.normalize().strftime("%Y-%m-%d"), "ns")
    return out


def parse_dates(arr: pa.ChunkedArray[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(datetime64[ns] dates with NaT where bad, the raw text of each cell) of a date column."""
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
    parsed = np.append(_parse_date_strings(uniq[:-1]), np.datetime64("NaT", "ns"))
    return parsed[indices], uniq[indices]
