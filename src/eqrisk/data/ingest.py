"""Ingestion: daily price files and a security master -> the ingested data set, with a report.

Price files are CSV, CSV.gz or Parquet, WIDE (`date` + one column per symbol) or LONG
(`date, symbol, close|adjusted_close, [open, high, low, volume, shares|market_cap]`). Every row
is validated; bad rows are rejected into `rejected.csv` with their reason, suspicious ones are
kept and listed in `flagged.csv`, and `report.json` summarises it all, so nothing is lost
silently. `eqrisk ingest` calls `ingest()` and `render_report()`.

Cells are read as text (pyarrow) and parsed with vectorised kernels, so a stray text cell is
reported rather than crashing the read; the two real data files ingest in a few seconds.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from eqrisk.data import store
from eqrisk.data.calendar import is_session
from eqrisk.data.master import ASSET_TYPES, etf_registry, sector_table

__all__ = [
    "IngestError",
    "IngestReport",
    "ingest",
    "read_master",
    "read_prices",
    "render_report",
]


class IngestError(ValueError):
    """A file that cannot be read, or whose columns are not recognised."""


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class IngestReport:
    started_at: str
    finished_at: str
    files: list[str]
    data_source: str
    rows_read: int
    rows_kept: int
    rows_rejected: int
    rows_flagged: int
    symbols: int  # in the ingested data set as written (after a merge: the union)
    sessions: int
    first_date: str | None
    last_date: str | None
    issues: list[dict] = field(default_factory=list)
    report_dir: str = ""

    @property
    def ok(self) -> bool:
        """False when any issue has severity error (rejected rows, empty files, bad master rows)."""
        return not any(issue["severity"] == "error" for issue in self.issues)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        return out


MAX_EXAMPLES = 5

# Issue codes: severity and the message shown in the report.
_CODES: dict[str, tuple[str, str]] = {
    "MALFORMED_ROW": ("error", "CSV line with the wrong number of fields: rejected"),
    "MISSING_SYMBOL": ("error", "empty symbol: row rejected"),
    "BAD_DATE": ("error", "date cannot be parsed: row rejected"),
    "NOT_A_SESSION": ("error", "date is not an NYSE session (weekend or holiday): row rejected"),
    "NON_NUMERIC_PRICE": (
        "error",
        "a price, volume, shares or market-cap cell is not a number: row rejected",
    ),
    "MISSING_PRICE": ("error", "long-format row without a close: row rejected"),
    "NON_POSITIVE_PRICE": ("error", "price, shares or market cap <= 0, or volume < 0: rejected"),
    "DUPLICATE_ROW": ("error", "duplicate (symbol, date): the first is kept, the others rejected"),
    "EMPTY": ("error", "file has no usable rows"),
    "NO_DATA": ("error", "no usable price rows at all: the ingested data set was left unchanged"),
    "BAD_ASSET_TYPE": ("error", "master asset_type is not stock, etf or index: treated as stock"),
    "MISSING_FROM_MASTER": (
        "warning",
        "symbol has prices but no master row (and is no known ETF): kept as an unclassified stock",
    ),
    "MISSING_PRICES": ("warning", "master symbol has no prices"),
    "UNKNOWN_SECTOR": ("warning", "GICS sector not in the reference table: no sector ETF/factor"),
    "DUPLICATE_MASTER_ROW": ("warning", "symbol repeated in the master: the first row is kept"),
    "MASTER_NO_SYMBOL": ("warning", "master row without a symbol: skipped"),
    "BAD_SHARES": ("warning", "master shares/market cap not a positive number: left empty"),
    "LARGE_MOVE": ("warning", "one-day |return| above max_move: row kept, listed in flagged.csv"),
}

# Row-level rejection reasons, in the order they are tested (bit i of a row's flags).
_ROW_CODES = (
    "MISSING_SYMBOL",
    "BAD_DATE",
    "NOT_A_SESSION",
    "NON_NUMERIC_PRICE",
    "MISSING_PRICE",
    "NON_POSITIVE_PRICE",
    "DUPLICATE_ROW",
)
_BIT = {code: np.uint16(1 << i) for i, code in enumerate(_ROW_CODES)}


class _Issues:
    """Issues summarised per (severity, code): count, message, up to MAX_EXAMPLES examples."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], dict] = {}

    def add(
        self,
        code: str,
        count: int,
        examples: Iterable[Any] = (),
        *,
        message: str | None = None,
        severity: str | None = None,
    ) -> None:
        if count <= 0:
            return
        default_severity, default_message = _CODES[code]
        severity = severity or default_severity
        item = self._items.setdefault(
            (severity, code),
            {
                "severity": severity,
                "code": code,
                "count": 0,
                "message": message or default_message,
                "examples": [],
            },
        )
        item["count"] += int(count)
        for example in examples:
            if len(item["examples"]) >= MAX_EXAMPLES:
                break
            item["examples"].append(_jsonable(example))

    def as_list(self) -> list[dict]:
        order = {code: i for i, code in enumerate(_CODES)}
        return sorted(
            self._items.values(),
            key=lambda it: (it["severity"] != "error", order.get(it["code"], 99)),
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if value != value else round(value, 10)
    if isinstance(value, pd.Timestamp | datetime):
        return value.strftime("%Y-%m-%d")
    return value


# --------------------------------------------------------------------------------------------
# Reading files

_PRICE_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")
_NA_TOKENS = ["", "na", "n/a", "nan", "null", "none", "#n/a"]
_NUMBER_RE = r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$"

# Long-format column aliases (names are compared lower-cased, spaces and dashes as underscores).
_LONG_ALIASES = {
    "date": "date",
    "symbol": "symbol",
    "ticker": "symbol",
    "close": "close",
    "adjusted_close": "adjusted_close",
    "adj_close": "adjusted_close",
    "adjclose": "adjusted_close",
    "open": "open",
    "high": "high",
    "low": "low",
    "volume": "volume",
    "shares": "shares",
    "market_cap": "market_cap",
    "marketcap": "market_cap",
}
_LONG_ONLY = {"close", "adjusted_close", "adj_close", "adjclose", "volume", "market_cap"}
ACCEPTED_PRICE_COLUMNS = (
    "WIDE: `date` plus one column per symbol (an empty cell = no price that day); "
    "LONG: `date`, `symbol` (or `ticker`), `close` and/or `adjusted_close` (or `adj_close`, "
    "`adjclose`), optional `open`, `high`, `low`, `volume`, `shares` or `market_cap` "
    "(names case-insensitive; other columns ignored)"
)
ACCEPTED_MASTER_COLUMNS = (
    "`symbol` (or `ticker`, `Symbol`), optional `name` (or `Security`), `asset_type` (or `kind`: "
    "stock|etf|index), `gics_sector` (or `GICS Sector`), `gics_sub_industry` (or "
    "`GICS Sub-Industry`), `shares` or `market_cap` (or `market_cap_<date>`, `Market Cap`)"
)


def _norm_name(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def _file_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise IngestError(
        f"{path}: unsupported file type; accepted: {', '.join(_PRICE_SUFFIXES)} (by suffix)"
    )


def _csv_header(path: Path) -> list[str]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh), None)
    except (OSError, UnicodeDecodeError, csv.Error, EOFError) as exc:
        raise IngestError(f"{path}: cannot be read: {exc}") from exc
    if not header or not any(h.strip() for h in header):
        raise IngestError(f"{path}: empty file (no header line)")
    return header


def _read_table(
    path: Path, keep: Callable[[list[str]], list[bool]] | None = None
) -> tuple[pa.Table, list[tuple[int | None, str]]]:
    """The file as an arrow table (CSV: every column as text) and its malformed CSV lines.

    `keep(header) -> mask` may leave columns out of a CSV read (they are never parsed)."""
    if not path.exists():
        raise IngestError(f"{path}: no such file")
    if _file_kind(path) == "parquet":
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise IngestError(f"{path}: cannot be read as Parquet: {exc}") from exc
        # a pandas index saved as a column is no data
        keep_cols = [n for n in table.column_names if not str(n).startswith("__index_level_")]
        return table.select(keep_cols), []
    names = _csv_header(path)
    # Unique internal names (a header may repeat a name); the real ones are restored below.
    internal = [f"c{i}" for i in range(len(names))]
    mask = keep(names) if keep is not None else [True] * len(names)
    wanted = [c for c, k in zip(internal, mask, strict=True) if k]
    bad_lines: list[tuple[int | None, str]] = []

    def handler(row: Any) -> str:
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


def _long_columns_only(header: list[str]) -> list[bool]:
    """A LONG file: only the recognised columns are read; any other file: all of them."""
    norm = [_norm_name(n) for n in header]
    if "symbol" not in norm and "ticker" not in norm:
        return [True] * len(header)
    return [n in _LONG_ALIASES for n in norm]


def _string_like(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        arr = arr.cast(pa.string())
    return arr


def _parse_numeric(arr: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values with NaN where missing or bad, missing mask, bad mask) of a column."""
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        values = pc.fill_null(arr.cast(pa.float64()), np.nan).to_numpy()
        missing = np.isnan(values)
        bad = np.isinf(values)
        values = np.where(bad, np.nan, values)
        return values, missing, bad
    text = pc.utf8_trim_whitespace(_string_like(arr))
    missing_arr = pc.or_(
        pc.is_null(text), pc.is_in(pc.utf8_lower(text), value_set=pa.array(_NA_TOKENS))
    )
    missing = pc.fill_null(missing_arr, True).to_numpy(zero_copy_only=False)
    usable = pc.if_else(missing_arr, pa.scalar(None, pa.string()), text)
    try:  # fast path: every present cell parses
        values = pc.fill_null(usable.cast(pa.float64()), np.nan).to_numpy()
        if np.isfinite(values[~missing]).all():
            return values, missing, np.zeros(len(values), dtype=bool)
    except pa.ArrowInvalid:
        pass
    valid = pc.fill_null(pc.match_substring_regex(text, _NUMBER_RE), False)
    values = pc.fill_null(
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
            if ts is pd.NaT and uniq[i].strip().lower() not in _NA_TOKENS:
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


def _parse_dates(arr: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
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
    encoded = pc.utf8_trim_whitespace(_string_like(arr)).combine_chunks().dictionary_encode()
    indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    uniq = np.asarray([*encoded.dictionary.to_pylist(), ""], dtype=object)
    parsed = np.append(_parse_date_strings(uniq[:-1]), np.datetime64("NaT", "ns"))
    return parsed[indices], uniq[indices]


def data_source_name(path: Path) -> str:
    """A file's name without its suffixes (`adjclose_wide_2010_2026.csv.gz` -> `adjclose_...`)."""
    name = path.name
    while True:
        stem, dot, suffix = name.rpartition(".")
        if dot and stem and suffix.lower() in {"gz", "csv", "parquet", "pq", "txt", "bz2", "zip"}:
            name = stem
        else:
            return name


def read_prices(path: Path) -> pd.DataFrame:
    """Any supported price file -> the canonical long frame.

    Columns: `store.PRICE_COLUMNS` (date as datetime64 with NaT where unparseable, symbol
    stripped and upper-cased, prices as float with NaN where missing or not a number), then
    `file` (the file name), `row` (the CSV line number, header = line 1; for Parquet the row
    number from 1) and `bad_cells` (None, or {canonical column or `shares`: raw text} for the
    cells that could not be parsed, which the report keeps). Malformed CSV lines are in `frame.attrs["malformed"]` as
    (line number, text). Wide files give one row per non-empty cell.
    """
    path = Path(path)
    table, malformed = _read_table(path, _long_columns_only)
    names = [str(n) for n in table.column_names]
    norm = [_norm_name(n) for n in names]
    if "date" not in norm:
        raise IngestError(
            f"{path}: no `date` column (columns: {names[:12]}); accepted: {ACCEPTED_PRICE_COLUMNS}"
        )
    first_line = 2 if _file_kind(path) == "csv" else 1
    if "symbol" in norm or "ticker" in norm:
        frame = _read_long(path, table, names, norm)
    else:
        long_like = sorted({n for n in norm if n in _LONG_ONLY})
        if long_like:
            raise IngestError(
                f"{path}: columns {long_like} look like a LONG file but there is no `symbol` "
                f"column; accepted: {ACCEPTED_PRICE_COLUMNS}"
            )
        if len(names) < 2:
            raise IngestError(
                f"{path}: a `date` column but no symbol columns; accepted: {ACCEPTED_PRICE_COLUMNS}"
            )
        frame = _read_wide(table, names, norm)
    frame["row"] = _line_numbers(frame.pop("_pos").to_numpy(), malformed, first_line)
    frame.insert(len(store.PRICE_COLUMNS), "file", path.name)
    frame = frame[[*store.PRICE_COLUMNS, "file", "row", "bad_cells"]]
    frame.attrs["malformed"] = [(n, text) for n, text in malformed]
    return frame


def _line_numbers(
    pos: np.ndarray, malformed: list[tuple[int | None, str]], first_line: int
) -> np.ndarray:
    """File line of each parsed data row (its position among the parsed rows), given the
    malformed lines that the reader skipped."""
    lines = pos.astype(np.int64) + first_line
    skipped = np.sort(np.array([n for n, _ in malformed if n is not None], dtype=np.int64))
    for line in skipped:  # few: each skipped line shifts the later rows by one
        lines[lines >= line] += 1
    return lines


def _bad_cells_column(n: int, bad: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Object column: None, or {field: raw text} for rows with unparseable cells."""
    out = np.full(n, None, dtype=object)
    for name, (rows, texts) in bad.items():
        for r, text in zip(rows.tolist(), texts, strict=True):
            if out[r] is None:
                out[r] = {}
            out[r][name] = text
    return out


def _symbols(names: np.ndarray) -> np.ndarray:
    return np.asarray([str(s).strip().upper() for s in names], dtype=object)


def _read_long(path: Path, table: pa.Table, names: list[str], norm: list[str]) -> pd.DataFrame:
    found: dict[str, int] = {}
    for i, n in enumerate(norm):
        canon = _LONG_ALIASES.get(n)
        if canon is None:
            continue
        if canon in found:
            raise IngestError(
                f"{path}: columns {names[found[canon]]!r} and {names[i]!r} both mean {canon!r}"
            )
        found[canon] = i
    if "close" not in found and "adjusted_close" not in found:
        raise IngestError(
            f"{path}: a LONG file needs `close` or `adjusted_close`; accepted: "
            f"{ACCEPTED_PRICE_COLUMNS}"
        )
    if "shares" in found and "market_cap" in found:
        raise IngestError(f"{path}: give `shares` or `market_cap`, not both")
    n = table.num_rows
    # canonical field -> source field
    sources: dict[str, str] = {}
    if "adjusted_close" in found:
        sources["close"] = "adjusted_close"
        if "close" in found:
            sources["close_raw"] = "close"
    else:
        sources["close"] = "close"
    for canon in ("open", "high", "low", "volume", "market_cap", "shares"):
        if canon in found:
            sources[canon] = canon

    out: dict[str, Any] = {}
    bad: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    dates, date_text = _parse_dates(table.column(found["date"]))
    out["date"] = dates
    bad_date = np.isnat(dates)
    if bad_date.any():
        rows = np.flatnonzero(bad_date)
        bad["date"] = (rows, date_text[rows])

    sym = pc.utf8_trim_whitespace(_string_like(table.column(found["symbol"])))
    encoded = sym.combine_chunks().dictionary_encode()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    cats = np.append(_symbols(np.asarray(encoded.dictionary.to_pylist(), dtype=object)), "")
    out["symbol"] = cats[codes]

    values: dict[str, np.ndarray] = {}
    for canon, src in sources.items():
        column = table.column(found[src])
        vals, _missing, is_bad = _parse_numeric(column)
        values[canon] = vals
        if is_bad.any():
            rows = np.flatnonzero(is_bad)
            text = _string_like(column).take(pa.array(rows)).to_pylist()
            bad[canon] = (rows, np.asarray(text, dtype=object))
    if "shares" in values:
        shares = values.pop("shares")
        base = values.get("close_raw")
        base = values["close"] if base is None else np.where(np.isnan(base), values["close"], base)
        values["market_cap"] = shares * base
    for canon in store.PRICE_COLUMNS[2:]:
        out[canon] = values.get(canon, np.full(n, np.nan))
    out["_pos"] = np.arange(n)
    out["bad_cells"] = _bad_cells_column(n, bad)
    return pd.DataFrame(out)


def _read_wide(table: pa.Table, names: list[str], norm: list[str]) -> pd.DataFrame:
    date_i = norm.index("date")
    value_idx = [i for i in range(len(names)) if i != date_i]
    symbols = _symbols(np.asarray([names[i] for i in value_idx], dtype=object))
    n_rows = table.num_rows
    dates, date_text = _parse_dates(table.column(date_i))
    columns = [table.column(i) for i in value_idx]
    if len({c.type for c in columns}) == 1:
        # One column-major array: every cell parsed in one pass.
        stacked = pa.chunked_array([ch for c in columns for ch in c.chunks], type=columns[0].type)
        vals, missing, is_bad = _parse_numeric(stacked)
    else:
        parts = [_parse_numeric(c) for c in columns]
        stacked = pa.chunked_array([ch for c in columns for ch in _string_like(c).chunks])
        vals, missing, is_bad = (np.concatenate([p[k] for p in parts]) for k in range(3))
    present = np.flatnonzero(~missing)  # a bad (text) cell is present; an empty one is not
    col_i, row_i = np.divmod(present, n_rows)
    n = len(present)
    bad: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cell_bad = np.flatnonzero(is_bad[present])
    if len(cell_bad):
        text = _string_like(stacked).take(pa.array(present[cell_bad])).to_pylist()
        bad["close"] = (cell_bad, np.asarray(text, dtype=object))
    out_dates = dates[row_i]
    date_bad = np.flatnonzero(np.isnat(out_dates))
    if len(date_bad):
        bad["date"] = (date_bad, date_text[row_i[date_bad]])
    out: dict[str, Any] = {
        "date": out_dates,
        "symbol": symbols[col_i] if n else np.array([], dtype=object),
        "close": vals[present],
    }
    for canon in store.PRICE_COLUMNS[3:]:
        out[canon] = np.full(n, np.nan)
    out["_pos"] = row_i
    out["bad_cells"] = _bad_cells_column(n, bad)
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------
# Master

_MASTER_ALIASES = {
    "symbol": "symbol",
    "ticker": "symbol",
    "name": "name",
    "security": "name",
    "security_name": "name",
    "company": "name",
    "company_name": "name",
    "asset_type": "asset_type",
    "kind": "asset_type",
    "type": "asset_type",
    "gics_sector": "gics_sector",
    "gics_sub_industry": "gics_sub_industry",
    "gics_subindustry": "gics_sub_industry",
    "sub_industry": "gics_sub_industry",
    "shares": "shares",
    "shares_outstanding": "shares",
    "market_cap": "market_cap",
    "marketcap": "market_cap",
}


def _master_canon(norm: str) -> str | None:
    if norm in _MASTER_ALIASES:
        return _MASTER_ALIASES[norm]
    if norm.startswith("market_cap_"):  # e.g. market_cap_2026_08_22
        return "market_cap"
    return None


def read_master(path: Path) -> pd.DataFrame:
    """A master file -> columns `store.RAW_MASTER_COLUMNS` plus `market_cap`.

    `shares` and `market_cap` are floats (NaN where absent or not a positive number);
    `ingest()` turns a market cap into shares with the symbol's latest price. asset_type is
    stock|etf|index (empty: etf for the known ETFs, else stock; anything else: stock, reported);
    sector names are matched to the reference table case-insensitively.
    """
    return _read_master(Path(path), _Issues())


def _read_master(path: Path, issues: _Issues) -> pd.DataFrame:
    table, _ = _read_table(path)
    names = [str(n) for n in table.column_names]
    chosen: dict[str, int] = {}
    for i, n in enumerate(names):
        canon = _master_canon(_norm_name(n))
        if canon is not None and canon not in chosen:
            chosen[canon] = i
    if "symbol" not in chosen:
        raise IngestError(
            f"{path}: no symbol column in the master (columns: {names[:12]}); accepted: "
            f"{ACCEPTED_MASTER_COLUMNS}"
        )
    n = table.num_rows

    def text(canon: str) -> pd.Series:
        if canon not in chosen:
            return pd.Series([""] * n, dtype=object)
        col = pc.utf8_trim_whitespace(_string_like(table.column(chosen[canon])))
        return pd.Series(pc.fill_null(col, "").to_pylist(), dtype=object)

    frame = pd.DataFrame(
        {
            "symbol": text("symbol").str.upper(),
            "name": text("name"),
            "asset_type": text("asset_type").str.lower(),
            "gics_sector": text("gics_sector"),
            "gics_sub_industry": text("gics_sub_industry"),
        }
    )
    frame["row"] = np.arange(n) + (2 if _file_kind(path) == "csv" else 1)
    for canon in ("shares", "market_cap"):
        if canon in chosen:
            col = table.column(chosen[canon])
            vals, missing, is_bad = _parse_numeric(col)
            non_pos = ~missing & ~is_bad & (vals <= 0)
            bad = is_bad | non_pos
            if bad.any():
                raw = _string_like(col).to_pylist()
                rows = np.flatnonzero(bad)
                issues.add(
                    "BAD_SHARES",
                    len(rows),
                    [{"symbol": frame["symbol"][r], canon: raw[r]} for r in rows[:MAX_EXAMPLES]],
                )
            frame[canon] = np.where(bad, np.nan, vals)
        else:
            frame[canon] = np.nan

    no_symbol = frame["symbol"] == ""
    if no_symbol.any():
        issues.add(
            "MASTER_NO_SYMBOL",
            int(no_symbol.sum()),
            [{"file": path.name, "row": int(r)} for r in frame.loc[no_symbol, "row"]],
        )
        frame = frame[~no_symbol]
    dup = frame["symbol"].duplicated(keep="first")
    if dup.any():
        issues.add(
            "DUPLICATE_MASTER_ROW",
            int(dup.sum()),
            [
                {"file": path.name, "row": int(r), "symbol": s}
                for r, s in zip(frame.loc[dup, "row"], frame.loc[dup, "symbol"], strict=True)
            ],
        )
        frame = frame[~dup]

    registry = set(etf_registry()["symbol"])
    empty_type = frame["asset_type"] == ""
    frame.loc[empty_type, "asset_type"] = np.where(
        frame.loc[empty_type, "symbol"].isin(registry), "etf", "stock"
    )
    bad_type = ~frame["asset_type"].isin(ASSET_TYPES)
    if bad_type.any():
        issues.add(
            "BAD_ASSET_TYPE",
            int(bad_type.sum()),
            [
                {"symbol": s, "asset_type": t}
                for s, t in zip(
                    frame.loc[bad_type, "symbol"], frame.loc[bad_type, "asset_type"], strict=True
                )
            ],
        )
        frame.loc[bad_type, "asset_type"] = "stock"

    known = {s.lower(): s for s in sector_table()["gics_sector"]}
    sectors = frame["gics_sector"].map(lambda s: known.get(s.lower(), s))
    frame["gics_sector"] = sectors
    unknown = (sectors != "") & ~sectors.isin(list(known.values()))
    if unknown.any():
        issues.add(
            "UNKNOWN_SECTOR",
            int(unknown.sum()),
            [
                {"symbol": s, "gics_sector": g}
                for s, g in zip(frame.loc[unknown, "symbol"], sectors[unknown], strict=True)
            ],
        )
    for col in ("name", "gics_sector", "gics_sub_industry"):
        frame[col] = frame[col].where(frame[col] != "", None)
    frame = frame.reset_index(drop=True)
    return frame[[*store.RAW_MASTER_COLUMNS, "market_cap"]]


# --------------------------------------------------------------------------------------------
# Ingest


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _make_report_dir(home: Path, now: datetime) -> Path:
    base = home / "reports"
    base.mkdir(parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%dT%H%M%S%f")
    for k in range(1000):
        folder = base / (f"ingest-{stamp}" if k == 0 else f"ingest-{stamp}-{k}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a report folder under {base}")


def _date_str(values: np.ndarray) -> np.ndarray:
    return np.datetime_as_string(values.astype("datetime64[D]"), unit="D")


def _row_examples(frame: pd.DataFrame, rows: np.ndarray, detail: bool = False) -> list[dict]:
    out = []
    for r in rows[:MAX_EXAMPLES]:
        rec = frame.iloc[int(r)]
        bad = rec["bad_cells"] or {}
        date = bad.get("date") if pd.isna(rec["date"]) else rec["date"].strftime("%Y-%m-%d")
        ex = {"file": rec["file"], "row": int(rec["row"]), "symbol": rec["symbol"], "date": date}
        if detail:
            ex["value"] = ", ".join(f"{k}={v!r}" for k, v in bad.items() if k != "date")
            if not ex["value"]:
                ex["value"] = ", ".join(
                    f"{c}={rec[c]:g}"
                    for c in store.PRICE_COLUMNS[2:]
                    if pd.notna(rec[c]) and (rec[c] <= 0 if c != "volume" else rec[c] < 0)
                )
        out.append(ex)
    return out


def _validate(frame: pd.DataFrame) -> tuple[np.ndarray, dict[int, int]]:
    """Rejection flags (bit per code of _ROW_CODES) of each row of the new price rows, and for
    each duplicate row the position of the row that is kept in its place."""
    n = len(frame)
    flags = np.zeros(n, dtype=np.uint16)
    flags[(frame["symbol"] == "").to_numpy()] |= _BIT["MISSING_SYMBOL"]
    dates = frame["date"]
    bad_date = dates.isna().to_numpy()
    flags[bad_date] |= _BIT["BAD_DATE"]
    if n:
        uniq = pd.Series(pd.unique(dates.dropna()))
        sessions = set(uniq[is_session(uniq).to_numpy()])
        not_session = ~bad_date & ~dates.isin(sessions).to_numpy()
        flags[not_session] |= _BIT["NOT_A_SESSION"]
    non_numeric = np.zeros(n, dtype=bool)
    has_bad = frame["bad_cells"].notna().to_numpy()
    if has_bad.any():
        non_numeric[has_bad] = [
            any(k != "date" for k in b) for b in frame["bad_cells"].to_numpy()[has_bad]
        ]
    flags[non_numeric] |= _BIT["NON_NUMERIC_PRICE"]
    flags[np.isnan(frame["close"].to_numpy()) & ~non_numeric] |= _BIT["MISSING_PRICE"]
    with np.errstate(invalid="ignore"):
        non_pos = np.zeros(n, dtype=bool)
        for col in ("close", "open", "high", "low", "close_raw", "market_cap"):
            non_pos |= frame[col].to_numpy() <= 0
        non_pos |= frame["volume"].to_numpy() < 0
    flags[non_pos] |= _BIT["NON_POSITIVE_PRICE"]
    # Duplicates among the otherwise good rows: the first one (file order) is kept.
    good = np.flatnonzero(flags == 0)
    if len(good):
        sym_codes, _ = pd.factorize(frame["symbol"].to_numpy()[good])
        day = frame["date"].to_numpy()[good].astype("datetime64[D]").astype(np.int64)
        key = sym_codes.astype(np.int64) * 1_000_000 + (day - day.min())
        keys = pd.Series(key)
        dup = keys.duplicated(keep="first").to_numpy()
        if dup.any():
            flags[good[dup]] |= _BIT["DUPLICATE_ROW"]
            first = pd.Series(good).groupby(key).transform("first").to_numpy()
            return flags, dict(zip(good[dup].tolist(), first[dup].tolist(), strict=True))
    return flags, {}


def _reason_strings(flags: np.ndarray) -> np.ndarray:
    out = np.empty(len(flags), dtype=object)
    for value in np.unique(flags):
        out[flags == value] = ";".join(c for c in _ROW_CODES if value & _BIT[c])
    return out


_REJECTED_COLUMNS = ["file", "row", *store.PRICE_COLUMNS, "reason", "detail"]
_FLAGGED_COLUMNS = ["symbol", "date", "prev_close", "close", "return"]


def _number_text(value: float) -> str:
    """A float as short text: 1000.0 -> '1000', 101.5 -> '101.5'."""
    return np.format_float_positional(value, trim="-")


def _rejected_frame(
    frame: pd.DataFrame,
    flags: np.ndarray,
    dup_of: dict[int, int],
    malformed: list[tuple[str, int | None, str]],
) -> pd.DataFrame:
    """The rejected rows as read (a bad cell keeps its raw text) with their reason(s)."""
    rows = np.flatnonzero(flags)
    sub = frame.iloc[rows]
    dates = sub["date"].to_numpy()
    out: dict[str, np.ndarray] = {
        "file": sub["file"].to_numpy(dtype=object),
        "row": sub["row"].to_numpy(dtype=object),
        "date": np.where(np.isnat(dates), "", _date_str(dates)).astype(object),
        "symbol": sub["symbol"].to_numpy(dtype=object),
    }
    for col in store.PRICE_COLUMNS[2:]:
        values = sub[col].to_numpy()
        out[col] = np.array(
            ["" if v != v else _number_text(v) for v in values.tolist()], dtype=object
        )
    detail = np.full(len(rows), "", dtype=object)
    for i, bad in enumerate(sub["bad_cells"].to_numpy()):
        if not bad:
            continue
        for key, text in bad.items():
            if key in out:
                out[key][i] = text
        detail[i] = ", ".join(f"{k}={t!r}" for k, t in bad.items())
    files = frame["file"].to_numpy()
    lines = frame["row"].to_numpy()
    for i, r in enumerate(rows.tolist()):
        if r in dup_of:
            kept = dup_of[r]
            detail[i] = f"duplicate of {files[kept]}:{lines[kept]} (kept)"
    out["reason"] = _reason_strings(flags[rows])
    out["detail"] = detail
    result = pd.DataFrame(out, columns=_REJECTED_COLUMNS)
    if malformed:
        extra = pd.DataFrame(
            [
                {"file": f, "row": "" if n is None else n, "reason": "MALFORMED_ROW", "detail": t}
                for f, n, t in malformed
            ],
            columns=_REJECTED_COLUMNS,
            dtype=object,  # all-empty price cells: object, so that "" is a valid fill
        ).fillna("")
        result = pd.concat([extra, result], ignore_index=True) if len(result) else extra
    return result


def _large_moves(final: pd.DataFrame, is_new: np.ndarray, max_move: float) -> pd.DataFrame:
    """One-day moves above max_move between consecutive rows of a symbol (sorted frame) that
    involve at least one newly ingested row."""
    sym = final["symbol"].to_numpy()
    close = final["close"].to_numpy()
    if len(final) < 2:
        return pd.DataFrame(columns=_FLAGGED_COLUMNS)
    with np.errstate(divide="ignore", invalid="ignore"):
        ret = close[1:] / close[:-1] - 1.0
    hit = (sym[1:] == sym[:-1]) & (np.abs(ret) > max_move) & (is_new[1:] | is_new[:-1])
    idx = np.flatnonzero(hit)
    return pd.DataFrame(
        {
            "symbol": sym[idx + 1],
            "date": _date_str(final["date"].to_numpy()[idx + 1]),
            "prev_close": close[idx],
            "close": close[idx + 1],
            "return": ret[idx],
        },
        columns=_FLAGGED_COLUMNS,
    )


def _last_prices(final: pd.DataFrame) -> pd.Series:
    """Latest price per symbol of a frame sorted by (symbol, date): raw close, else close."""
    if final.empty:
        return pd.Series(dtype=float)
    last = final.drop_duplicates("symbol", keep="last")
    base = last["close_raw"].where(last["close_raw"].notna(), last["close"])
    return pd.Series(base.to_numpy(), index=last["symbol"].to_numpy())


def _empty_master() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in store.RAW_MASTER_COLUMNS})


def _previous_master(home: Path) -> pd.DataFrame | None:
    path = store.ingested_dir(home) / "master.parquet"
    return pd.read_parquet(path) if path.exists() else None


def _sort_prices(frame: pd.DataFrame) -> pd.DataFrame:
    codes, _ = pd.factorize(frame["symbol"], sort=True)
    day = frame["date"].to_numpy().astype("datetime64[D]").astype(np.int64)
    order = np.lexsort((day, codes))
    return frame.iloc[order].reset_index(drop=True)


def ingest(
    prices: list[Path],
    master: Path | None,
    *,
    home: Path,
    max_move: float = 0.5,
    merge: bool = False,
    data_source: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> IngestReport:
    """Read, validate and store price files (and a master); write the report folder.

    Rejected rows (errors) are left out and listed in `rejected.csv`; large moves are kept and
    listed in `flagged.csv`; `report.json` holds `IngestReport.to_dict()`. Without a master the
    previously ingested one is kept (else an empty one). `merge=True` unions with the previously
    ingested data set, new rows replacing old ones for the same (symbol, date) and new master
    rows replacing old ones. When no row at all is usable, the ingested data set is left as it
    was (issue NO_DATA). Raises IngestError for a file that cannot be read or whose columns are
    not recognised (before anything is written).
    """
    say = progress or (lambda _message: None)
    if not max_move > 0:
        raise ValueError(f"max_move must be > 0, got {max_move}")
    started = _utc_now()
    home = Path(home).expanduser()
    price_paths = [Path(p) for p in prices]
    master_path = Path(master) if master is not None else None
    if not price_paths and not merge:
        raise IngestError("no price file given")
    issues = _Issues()

    frames: list[pd.DataFrame] = []
    malformed: list[tuple[str, int | None, str]] = []
    for path in price_paths:
        say(f"reading {path.name}")
        frame = read_prices(path)
        malformed += [(path.name, n, text) for n, text in frame.attrs.get("malformed", [])]
        frames.append(frame)
    master_frame = None
    if master_path is not None:
        say(f"reading master {master_path.name}")
        master_frame = _read_master(master_path, issues)

    say("validating")
    nonempty = [f for f in frames if len(f)]
    if nonempty:
        new = pd.concat(nonempty, ignore_index=True) if len(nonempty) > 1 else nonempty[0]
    else:
        new = _empty_prices()
    new.attrs = {}
    flags, dup_of = _validate(new)
    issues.add(
        "MALFORMED_ROW",
        len(malformed),
        [{"file": f, "row": n, "text": t[:200]} for f, n, t in malformed],
    )
    for code in _ROW_CODES:
        rows = np.flatnonzero(flags & _BIT[code])
        detail = code in ("NON_NUMERIC_PRICE", "NON_POSITIVE_PRICE")
        issues.add(code, len(rows), _row_examples(new, rows, detail=detail))
    kept_mask = flags == 0
    offset = 0
    for path, frame in zip(price_paths, frames, strict=True):
        n_kept = int(kept_mask[offset : offset + len(frame)].sum()) if len(frame) else 0
        offset += len(frame)
        if n_kept == 0:
            issues.add("EMPTY", 1, [{"file": str(path), "rows_read": len(frame)}])

    kept = new.loc[kept_mask, store.PRICE_COLUMNS]
    is_new_col = np.ones(len(kept), dtype=bool)
    final = kept.assign(_new=is_new_col)
    old_master = None
    if merge:
        try:
            old_prices, old_master, _ = store.read_ingested(home)
        except FileNotFoundError:
            old_prices = None
        if old_prices is not None and len(old_prices):
            old = old_prices.reindex(columns=store.PRICE_COLUMNS)
            old["date"] = pd.to_datetime(old["date"]).astype("datetime64[ns]")
            old["symbol"] = old["symbol"].astype(object)
            final = pd.concat([final, old.assign(_new=False)], ignore_index=True)
            final = final[~final.duplicated(["symbol", "date"], keep="first")]
    elif master_path is None:
        old_master = _previous_master(home)
    final = _sort_prices(final)

    flagged = _large_moves(final, final["_new"].to_numpy(dtype=bool), max_move)
    if len(flagged):
        top = flagged.reindex(flagged["return"].abs().sort_values(ascending=False).index)
        issues.add(
            "LARGE_MOVE",
            len(flagged),
            top.head(MAX_EXAMPLES).to_dict("records"),
            message=f"one-day |return| above {max_move:g}: row kept, listed in flagged.csv",
        )
    final = final.drop(columns="_new")

    # Master: the new one (merged over the old one), else the old one, else empty.
    if master_frame is not None:
        out_master = master_frame
        if merge and old_master is not None and len(old_master):
            old_m = old_master.reindex(columns=store.RAW_MASTER_COLUMNS).assign(market_cap=np.nan)
            out_master = pd.concat([master_frame, old_m], ignore_index=True)
            out_master = out_master.drop_duplicates("symbol", keep="first")
        need = out_master["shares"].isna() & out_master["market_cap"].notna()
        if need.any():
            last = _last_prices(final)
            base = out_master.loc[need, "symbol"].map(last)
            out_master.loc[need, "shares"] = out_master.loc[need, "market_cap"] / base
        out_master = out_master[store.RAW_MASTER_COLUMNS].reset_index(drop=True)
        price_symbols = set(final["symbol"].unique())
        registry = set(etf_registry()["symbol"])
        missing_master = sorted(price_symbols - set(out_master["symbol"]) - registry)
        issues.add("MISSING_FROM_MASTER", len(missing_master), missing_master)
        missing_prices = sorted(set(master_frame["symbol"]) - price_symbols)
        issues.add("MISSING_PRICES", len(missing_prices), missing_prices)
    elif old_master is not None:
        out_master = old_master
    else:
        out_master = _empty_master()

    say("writing")
    report_dir = _make_report_dir(home, started)
    _rejected_frame(new, flags, dup_of, malformed).to_csv(report_dir / "rejected.csv", index=False)
    flagged.to_csv(report_dir / "flagged.csv", index=False)
    if final.empty:
        issues.add("NO_DATA", 1, [{"files": [str(p) for p in price_paths]}])

    files = [str(p) for p in price_paths] + ([str(master_path)] if master_path else [])
    source = data_source or (data_source_name(price_paths[0]) if price_paths else "merge")
    dates = final["date"]
    report = IngestReport(
        started_at=started.isoformat(),
        finished_at="",
        files=files,
        data_source=source,
        rows_read=len(new) + len(malformed),
        rows_kept=int(kept_mask.sum()),
        rows_rejected=int((~kept_mask).sum()) + len(malformed),
        rows_flagged=len(flagged),
        symbols=int(final["symbol"].nunique()),
        sessions=int(dates.nunique()),
        first_date=dates.min().strftime("%Y-%m-%d") if len(dates) else None,
        last_date=dates.max().strftime("%Y-%m-%d") if len(dates) else None,
        issues=[],
        report_dir=str(report_dir),
    )
    if not final.empty:
        meta = {
            "data_source": source,
            "files": files,
            "ingested_at": _utc_now().isoformat(),
            "report_dir": str(report_dir),
            "merge": merge,
            "max_move": max_move,
            "counts": {
                "rows_read": report.rows_read,
                "rows_kept": report.rows_kept,
                "rows_rejected": report.rows_rejected,
                "rows_flagged": report.rows_flagged,
                "rows_stored": len(final),
                "symbols": report.symbols,
                "sessions": report.sessions,
                "master_rows": len(out_master),
            },
        }
        store.write_ingested(home, final, out_master, meta)
    report.issues = issues.as_list()
    report.finished_at = _utc_now().isoformat()
    (report_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
    return report


def _empty_prices() -> pd.DataFrame:
    """An empty canonical price frame (the columns of `read_prices`)."""
    frame = pd.DataFrame({c: pd.Series(dtype=float) for c in store.PRICE_COLUMNS})
    frame["date"] = pd.Series(dtype="datetime64[ns]")
    frame["symbol"] = pd.Series(dtype=object)
    frame["file"] = pd.Series(dtype=object)
    frame["row"] = pd.Series(dtype=np.int64)
    frame["bad_cells"] = pd.Series(dtype=object)
    return frame


# --------------------------------------------------------------------------------------------
# Rendering


def _format_example(example: Any) -> str:
    if not isinstance(example, dict):
        return str(example)
    if "file" in example and "row" in example and "symbol" in example:
        text = f"{example.get('symbol') or '?'} {example.get('date') or '?'}"
        text += f" ({example['file']}:{example['row']})"
        if example.get("value"):
            text += f" {example['value']}"
        return text
    if "return" in example:
        return (
            f"{example['symbol']} {example['date']} {example['prev_close']:g} -> "
            f"{example['close']:g} ({example['return']:+.0%})"
        )
    return ", ".join(f"{k}={v}" for k, v in example.items())


def render_report(report: IngestReport, console: Console) -> None:
    """A readable summary: status, counts, a table of issues with examples, where files are."""
    status = "[bold green]OK[/]" if report.ok else "[bold red]ERRORS[/]"
    console.print(f"[bold]Ingest[/] {report.data_source}: {status}")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("files", "\n".join(report.files) or "-")
    summary.add_row(
        "rows",
        f"{report.rows_read:,} read, {report.rows_kept:,} kept, "
        f"{report.rows_rejected:,} rejected, {report.rows_flagged:,} flagged",
    )
    span = f"{report.first_date} .. {report.last_date}" if report.first_date else "-"
    summary.add_row("data set", f"{report.symbols:,} symbols, {report.sessions:,} sessions, {span}")
    console.print(summary)
    if report.issues:
        table = Table(title="Issues", show_lines=False, expand=False)
        table.add_column("severity")
        table.add_column("code", style="bold")
        table.add_column("count", justify="right")
        table.add_column("what")
        table.add_column("examples", overflow="fold")
        for issue in report.issues:
            colour = "red" if issue["severity"] == "error" else "yellow"
            table.add_row(
                f"[{colour}]{issue['severity']}[/]",
                issue["code"],
                f"{issue['count']:,}",
                issue["message"],
                "\n".join(_format_example(e) for e in issue["examples"]),
            )
        console.print(table)
    else:
        console.print("[green]no issues[/]")
    folder = Path(report.report_dir)
    console.print(
        f"report: {folder / 'report.json'}\n"
        f"rejected rows: {folder / 'rejected.csv'} ({report.rows_rejected:,})\n"
        f"flagged rows: {folder / 'flagged.csv'} ({report.rows_flagged:,})"
    )
