"""Price files (WIDE, LONG or one symbol per file; CSV, CSV.gz, Parquet) -> the canonical
price frame `read_prices` returns, bad cells kept as text for the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from eqrisk.data import panel
from eqrisk.data.cells import (
    InputLimits,
    file_kind,
    fill_null,
    norm_name,
    parse_dates,
    parse_numeric,
    read_table,
    string_like,
)
from eqrisk.data.columns import (
    canonical_header,
    symbol_from_file_name,
)
from eqrisk.data.corporate_actions import (
    FACTOR_COLUMNS,
    PRICE_BASES,
    resolve_basis,
    total_return_close,
)
from eqrisk.data.ingest_report import IngestError

# Long-format column aliases (names are compared lower-cased, spaces and dashes as underscores).
LONG_ALIASES = {
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
    **FACTOR_COLUMNS,
}
_LONG_ONLY = {"close", "adjusted_close", "adj_close", "adjclose", "volume", "market_cap"}
ACCEPTED_PRICE_COLUMNS = (
    "WIDE: `date` plus one column per symbol (an empty cell = no price that day); ONE SYMBOL "
    "per file: LONG columns without a symbol column, the symbol being the file name; "
    "LONG: `date`, `symbol` (or `ticker`), `close` and/or `adjusted_close` (or `adj_close`, "
    "`adjclose`), optional `open`, `high`, `low`, `volume`, `shares` or `market_cap` "
    "(names case-insensitive; other columns ignored)"
)


def _long_columns_only(header: list[str]) -> list[bool]:
    """A LONG file: only the recognised columns are read; any other file: all of them."""
    norm = [norm_name(n) for n in header]
    if "symbol" not in norm and "ticker" not in norm:
        return [True] * len(header)
    return [n in LONG_ALIASES for n in norm]


def data_source_name(path: Path) -> str:
    """A file's name without its suffixes (`adjclose_wide_2010_2026.csv.gz` -> `adjclose_...`)."""
    name = path.name
    while True:
        stem, dot, suffix = name.rpartition(".")
        if dot and stem and suffix.lower() in {"gz", "csv", "parquet", "pq", "txt", "bz2", "zip"}:
            name = stem
        else:
            return name


def source_label(given: list[Path], files: list[Path]) -> str:
    """The data_source of an ingest without --source: the folder's name when the first thing
    given is a folder (`prices/` of AAL.csv, AAPL.csv, ...: `prices`, not `AAL`), else the
    first file's name without its suffixes; `merge` for a merge given no price file."""
    if given and Path(given[0]).is_dir():
        return Path(given[0]).resolve().name or "prices"
    return data_source_name(files[0]) if files else "merge"


def read_prices(
    path: Path,
    *,
    basis: str = "auto",
    columns: dict[str, str] | None = None,
    date_format: str | None = None,
    limits: InputLimits | None = None,
) -> pd.DataFrame:
    """Any supported price file -> the canonical long frame.

    Columns: `panel.PRICE_COLUMNS` (date as datetime64 with NaT where unparseable, symbol
    stripped and upper-cased, prices as float with NaN where missing or not a number), then
    `file` (the file name), `row` (the CSV line number, header = line 1; for Parquet the row
    number from 1) and `bad_cells` (None, or {canonical column or `shares`: raw text} for the
    cells that could not be parsed, which the report keeps). Malformed CSV lines are in `frame.attrs["malformed"]` as
    (line number, text). Wide files give one row per non-empty cell.

    `basis` says what the closes are (`corporate_actions.PRICE_BASES`); `frame.attrs["basis"]`
    says how they were read: `adjusted`, `total_return` (raw closes and the file's split and
    dividend factors) or `unknown` (closes that may be raw: ingest looks for unadjusted splits).

    Text dates are read with one format for the whole file (`date_format`, else the one its
    values admit; `dates.DateFormatError` for an ambiguous or mixed column). `limits` bound
    the length of a line and of a cell (`cells.read_table`).
    """
    if basis not in PRICE_BASES:
        raise IngestError(f"price basis {basis!r} is not one of {', '.join(PRICE_BASES)}")
    path = Path(path)
    table, malformed = read_table(
        path, lambda header: _long_columns_only(canonical_header(header, columns)), limits
    )
    names = canonical_header([str(n) for n in table.column_names], columns)
    norm = [norm_name(n) for n in names]
    one_symbol = "symbol" not in norm and "ticker" not in norm
    if "date" in norm and one_symbol and any(n in _LONG_ONLY for n in norm):
        # One symbol's file (AAPL.csv: date, open, ..., close): the symbol is its name.
        table = table.append_column(
            "symbol", pa.array([symbol_from_file_name(path)] * table.num_rows, pa.string())
        )
        names, norm = [*names, "symbol"], [*norm, "symbol"]
    table = table.rename_columns(names)
    if "date" not in norm:
        raise IngestError(
            f"{path}: no `date` column (columns: {names[:12]}); accepted: {ACCEPTED_PRICE_COLUMNS}"
        )
    first_line = 2 if file_kind(path) == "csv" else 1
    if "symbol" in norm or "ticker" in norm:
        frame = _read_long(path, table, names, norm, basis, date_format)
    else:
        if len(names) < 2:
            raise IngestError(
                f"{path}: a `date` column but no symbol columns; accepted: {ACCEPTED_PRICE_COLUMNS}"
            )
        frame = _read_wide(path, table, names, norm, date_format)
        frame.attrs["basis"] = "adjusted" if basis == "adjusted" else "unknown"
    frame["row"] = _line_numbers(frame.pop("_pos").to_numpy(), malformed, first_line)
    frame.insert(len(panel.PRICE_COLUMNS), "file", path.name)
    read_basis = frame.attrs.get("basis", "unknown")
    frame = frame[[*panel.PRICE_COLUMNS, "file", "row", "bad_cells"]]
    frame.attrs["malformed"] = [(n, text) for n, text in malformed]
    frame.attrs["basis"] = read_basis
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


def _long_layout(
    path: Path, names: list[str], norm: list[str], basis: str
) -> tuple[dict[str, int], dict[str, str], list[str], str]:
    """A LONG file's columns: position of each recognised one, the source of each canonical
    field, the corporate-action factor columns, and the basis its closes are read on."""
    found: dict[str, int] = {}
    for i, n in enumerate(norm):
        canon = LONG_ALIASES.get(n)
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
    # canonical field -> source field
    sources: dict[str, str] = {}
    factors: list[str] = [c for c in ("split_coefficient", "dividend_amount") if c in found]
    read_basis = resolve_basis(basis, "adjusted_close" in found, "close" in found, bool(factors))
    if read_basis == "total_return" or (basis == "raw" and "close" in found):
        sources["close_raw"] = "close"
        sources["close"] = "close"
    elif "adjusted_close" in found:
        sources["close"] = "adjusted_close"
        if "close" in found:
            sources["close_raw"] = "close"
    else:
        sources["close"] = "close"
    for canon in ("open", "high", "low", "volume", "market_cap", "shares"):
        if canon in found:
            sources[canon] = canon
    return found, sources, factors, read_basis


def _read_long(
    path: Path,
    table: pa.Table,
    names: list[str],
    norm: list[str],
    basis: str = "auto",
    date_format: str | None = None,
) -> pd.DataFrame:
    found, sources, factors, read_basis = _long_layout(path, names, norm, basis)
    n = table.num_rows
    out: dict[str, Any] = {}
    bad: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    dates, date_text = parse_dates(table.column(found["date"]), date_format, source=str(path))
    out["date"] = dates
    bad_date = np.isnat(dates)
    if bad_date.any():
        rows = np.flatnonzero(bad_date)
        bad["date"] = (rows, date_text[rows])

    sym = pc.utf8_trim_whitespace(string_like(table.column(found["symbol"])))
    encoded = sym.combine_chunks().dictionary_encode()
    codes = fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    cats = np.append(_symbols(np.asarray(encoded.dictionary.to_pylist(), dtype=object)), "")
    out["symbol"] = cats[codes]

    values: dict[str, np.ndarray] = {}
    for canon, src in sources.items():
        column = table.column(found[src])
        vals, _missing, is_bad = parse_numeric(column)
        values[canon] = vals
        if is_bad.any():
            rows = np.flatnonzero(is_bad)
            text = string_like(column).take(rows).to_pylist()
            bad[canon] = (rows, np.asarray(text, dtype=object))
    if read_basis == "total_return":
        # Raw closes with their factors: the model's close is the total-return close.
        parsed = {c: parse_numeric(table.column(found[c]))[0] for c in factors}
        values["close"] = total_return_close(
            out["symbol"],
            out["date"],
            values["close_raw"],
            split=parsed.get("split_coefficient"),
            dividend=parsed.get("dividend_amount"),
        )
    if "shares" in values:
        shares = values.pop("shares")
        base = values.get("close_raw")
        base = values["close"] if base is None else np.where(np.isnan(base), values["close"], base)
        values["market_cap"] = shares * base
    for canon in panel.PRICE_COLUMNS[2:]:
        out[canon] = values.get(canon, np.full(n, np.nan))
    out["_pos"] = np.arange(n)
    out["bad_cells"] = _bad_cells_column(n, bad)
    frame = pd.DataFrame(out)
    frame.attrs["basis"] = read_basis
    return frame


def _read_wide(
    path: Path, table: pa.Table, names: list[str], norm: list[str], date_format: str | None
) -> pd.DataFrame:
    date_i = norm.index("date")
    value_idx = [i for i in range(len(names)) if i != date_i]
    symbols = _symbols(np.asarray([names[i] for i in value_idx], dtype=object))
    n_rows = table.num_rows
    dates, date_text = parse_dates(table.column(date_i), date_format, source=str(path))
    columns = [table.column(i) for i in value_idx]
    if len({c.type for c in columns}) == 1:
        # One column-major array: every cell parsed in one pass.
        stacked = pa.chunked_array([ch for c in columns for ch in c.chunks], type=columns[0].type)
        vals, missing, is_bad = parse_numeric(stacked)
    else:
        parts = [parse_numeric(c) for c in columns]
        stacked = pa.chunked_array([ch for c in columns for ch in string_like(c).chunks])
        vals, missing, is_bad = (np.concatenate([p[k] for p in parts]) for k in range(3))
    present = np.flatnonzero(~missing)  # a bad (text) cell is present; an empty one is not
    col_i, row_i = np.divmod(present, n_rows)
    n = len(present)
    bad: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cell_bad = np.flatnonzero(is_bad[present])
    if len(cell_bad):
        text = string_like(stacked).take(present[cell_bad]).to_pylist()
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
    for canon in panel.PRICE_COLUMNS[3:]:
        out[canon] = np.full(n, np.nan)
    out["_pos"] = row_i
    out["bad_cells"] = _bad_cells_column(n, bad)
    return pd.DataFrame(out)


def empty_prices() -> pd.DataFrame:
    """An empty canonical price frame (the columns of `read_prices`)."""
    frame = pd.DataFrame({c: pd.Series(dtype=float) for c in panel.PRICE_COLUMNS})
    frame["date"] = pd.Series(dtype="datetime64[ns]")
    frame["symbol"] = pd.Series(dtype=object)
    frame["file"] = pd.Series(dtype=object)
    frame["row"] = pd.Series(dtype=np.int64)
    frame["bad_cells"] = pd.Series(dtype=object)
    return frame
