"""Corporate actions: total-return closes from raw closes and their split/dividend/spin-off
factors, the split ratios a missing adjustment is matched against, and the returns the model
leaves out (`return_breaks`; found by `eqrisk.data.return_cleaning`).

Conventions (those of the shared OHLCV file, whose adjusted closes they reproduce to 1e-11):
- `split` on the ex-date: new shares per old share (7 for a 7:1 split, 0.1 for a 1:10 reverse
  split); `dividend` and `spinoff` on the ex-date: cash (or the value of the distributed shares)
  per share after that day's split; `factor`: a multiplier a vendor applies to the prices before
  the ex-date, used as given (1 = none).
- The total return into row t is r_t = (P_t + D_t) k_t / P_{t-1} - 1. The total-return close is
  P_t C_t with C_T = 1 on the last row and C_{t-1} = C_t f_t / (k_t (1 + D_t / P_t)), so each
  row's factor depends only on its own values and the returns the model computes from the
  adjusted closes are exactly these total returns.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.data.cells import InputLimits, read_table
from eqrisk.data.dates import parse_date_values

__all__ = [
    "FACTOR_COLUMNS",
    "PRICE_BASES",
    "SPLIT_RATIOS",
    "apply_actions",
    "read_actions",
    "resolve_basis",
    "return_breaks",
    "total_return_close",
]

ACCEPTED_ACTION_COLUMNS = (
    "`symbol`, `date`, and any of `split` (new shares per old share, or `7:1` / `1-for-10`), "
    "`dividend` (cash per share), `spinoff` (value distributed per share), `factor` (multiplier "
    "of the prices before the ex-date)"
)
_ACTION_ALIASES = {
    "symbol": "symbol",
    "ticker": "symbol",
    "name": "symbol",
    "ticker_symbol": "symbol",
    "date": "date",
    "ex_date": "date",
    "split": "split",
    "split_coefficient": "split",
    "split_ratio": "split",
    "split_factor": "split",
    "stock_splits": "split",
    "dividend": "dividend",
    "dividends": "dividend",
    "dividend_amount": "dividend",
    "spinoff": "spinoff",
    "spin_off": "spinoff",
    "spinoff_value": "spinoff",
    "factor": "factor",
    "adjustment_factor": "factor",
    "price_factor": "factor",
}


# What the closes of a price file are: `auto` (decided from its columns), `adjusted` (split-
# and dividend-adjusted already: used as they are) or `raw` (as traded: with factors the model
# uses total returns, without them unadjusted splits are looked for).
PRICE_BASES: tuple[str, ...] = ("auto", "adjusted", "raw")

# Long-file columns that carry factors (names compared lower-cased, spaces as underscores).
FACTOR_COLUMNS: dict[str, str] = {
    "split_coefficient": "split_coefficient",
    "split_factor": "split_coefficient",
    "split_ratio": "split_coefficient",
    "stock_splits": "split_coefficient",
    "splits": "split_coefficient",
    "dividend_amount": "dividend_amount",
    "dividend": "dividend_amount",
    "dividends": "dividend_amount",
}


def resolve_basis(basis: str, has_adjusted: bool, has_close: bool, has_factors: bool) -> str:
    """How a long file's closes are read: `adjusted`, `total_return` or `unknown`.

    auto: an adjusted-close column is used as it is; else raw closes with factor columns give
    total returns; else the closes may be raw (`unknown`: ingest looks for unadjusted splits).
    raw: total returns where the file has factors, else `unknown`. adjusted: as given.
    """
    if basis == "adjusted":
        return "adjusted"
    if basis == "raw" or not has_adjusted:
        return "total_return" if has_factors and has_close else "unknown"
    return "adjusted"


def total_return_close(
    symbol: np.ndarray,
    day: np.ndarray,
    close: np.ndarray,
    split: np.ndarray | None = None,
    dividend: np.ndarray | None = None,
    factor: np.ndarray | None = None,
) -> np.ndarray:
    """Total-return (split- and dividend-adjusted) closes of raw closes, anchored at each
    symbol's last raw close. Rows may come in any order; missing factors mean none; a row
    without a usable close keeps its split and factor (the event happened) but no dividend."""
    n = len(close)
    close = np.asarray(close, dtype=np.float64)

    def col(values: np.ndarray | None, default: float, positive: bool) -> np.ndarray:
        if values is None:
            return np.full(n, default)
        v = np.asarray(values, dtype=np.float64)
        usable = np.isfinite(v) & ((v > 0) if positive else (v >= 0))
        return np.where(usable, v, default)

    k = col(split, 1.0, positive=True)
    d = col(dividend, 0.0, positive=False)
    f = col(factor, 1.0, positive=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        div_ratio = np.where(np.isfinite(close) & (close > 0), d / close, 0.0)
    # The factor each row applies to the rows before it.
    step = f / (k * (1.0 + div_ratio))
    order = np.lexsort((np.asarray(day).astype("datetime64[D]").astype(np.int64), symbol))
    sym_sorted = np.asarray(symbol, dtype=object)[order]
    step_sorted = pd.Series(step[order])
    # C of a row: product of the steps of the later rows of its symbol (exclusive).
    later = step_sorted.groupby(sym_sorted).shift(-1).fillna(1.0)
    rev = later.iloc[::-1]
    cum = rev.groupby(sym_sorted[::-1]).cumprod().iloc[::-1].to_numpy()
    out = np.empty(n)
    out[order] = close[order] * cum
    return out


def read_actions(
    path: Path, date_format: str | None = None, limits: InputLimits | None = None
) -> pd.DataFrame:
    """A corporate-actions file -> `symbol, date, split, dividend, factor` (spin-off values are
    added to the dividend: value distributed per share). Raises ValueError on unknown layouts.
    Dates are read with one format for the file (`dates.parse_date_values`); a CSV is read
    within `limits` (`cells.read_table`)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such corporate-actions file")
    if path.name.lower().endswith((".parquet", ".pq")):
        raw = pd.read_parquet(path)
    elif path.name.lower().endswith((".csv", ".csv.gz")):
        table, malformed = read_table(path, limits=limits)
        if malformed:
            lines = [n for n, _ in malformed][:5]
            raise ValueError(f"{path}: lines {lines} have the wrong number of fields")
        raw = table.to_pandas()
    else:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    names = {c: _ACTION_ALIASES.get(re.sub(r"[\s\-]+", "_", str(c).strip().lower())) for c in raw}
    chosen: dict[str, str] = {}
    for col, canon in names.items():
        if canon is not None and canon not in chosen:
            chosen[canon] = str(col)  # read_csv's column names: already text
    if "symbol" not in chosen or "date" not in chosen or len(chosen) < 3:
        raise ValueError(
            f"{path}: columns {list(raw.columns)[:12]} are not a corporate-actions file; "
            f"accepted: {ACCEPTED_ACTION_COLUMNS}"
        )
    out = pd.DataFrame(
        {
            "symbol": raw[chosen["symbol"]].astype(str).str.strip().str.upper(),
            "date": _action_dates(raw[chosen["date"]], date_format, path),
        }
    )
    bad_date = out["date"].isna()
    if bad_date.any():
        rows = (np.flatnonzero(bad_date) + 2).tolist()[:5]
        raise ValueError(f"{path}: unparseable dates on lines {rows}")
    out["split"] = (
        raw[chosen["split"]].map(parse_split_ratio).astype(float) if "split" in chosen else 1.0
    )
    dividend = _numbers(raw, chosen.get("dividend"), 0.0)
    out["dividend"] = dividend + _numbers(raw, chosen.get("spinoff"), 0.0)
    out["factor"] = _numbers(raw, chosen.get("factor"), 1.0)
    if (out["split"] <= 0).any() or (out["factor"] <= 0).any() or (out["dividend"] < 0).any():
        raise ValueError(f"{path}: splits and factors must be > 0 and dividends >= 0")
    # Several actions of one symbol on one day combine.
    return (
        out.groupby(["symbol", "date"], as_index=False)
        .agg(split=("split", "prod"), dividend=("dividend", "sum"), factor=("factor", "prod"))
        .sort_values(["symbol", "date"], ignore_index=True)
    )


def _action_dates(column: pd.Series, date_format: str | None, path: Path) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(column):
        dates = pd.to_datetime(column)
        if dates.dt.tz is not None:
            dates = dates.dt.tz_localize(None)
        return dates.dt.normalize()
    text = column.astype(str).str.strip()
    uniq = pd.unique(text.to_numpy(dtype=object))
    parsed = parse_date_values(list(uniq), date_format, source=str(path))
    return pd.Series(text.map(dict(zip(uniq, parsed, strict=True))).to_numpy("datetime64[ns]"))


def apply_actions(prices: pd.DataFrame, actions: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Total-return closes for the symbols of a corporate-actions table: their `close` becomes
    the total-return close of their raw close (`close_raw`, else `close`, which is then raw).
    An action dated on a day without a price row applies to the symbol's next priced row.
    Returns the new frame and the symbols adjusted."""
    symbols = sorted(set(actions["symbol"]) & set(prices["symbol"]))
    if not symbols:
        return prices, []
    out = prices.copy()
    mask = out["symbol"].isin(symbols).to_numpy()
    sub = out.loc[mask, ["symbol", "date", "close", "close_raw"]].copy()
    raw = sub["close_raw"].where(sub["close_raw"].notna(), sub["close"]).to_numpy(float)
    sub["_i"] = np.arange(len(sub))
    rows = sub.sort_values("date")
    acts = actions[actions["symbol"].isin(symbols)].sort_values("date")
    hit = pd.merge_asof(
        acts.astype({"date": rows["date"].dtype}),
        rows[["symbol", "date", "_i"]],
        on="date",
        by="symbol",
        direction="forward",
    ).dropna(subset=["_i"])
    split = np.ones(len(sub))
    dividend = np.zeros(len(sub))
    factor = np.ones(len(sub))
    for i, k, d, f in zip(
        hit["_i"].astype(int), hit["split"], hit["dividend"], hit["factor"], strict=True
    ):
        split[i] *= k
        dividend[i] += d
        factor[i] *= f
    sub_close = total_return_close(
        sub["symbol"].to_numpy(), sub["date"].to_numpy(), raw, split, dividend, factor
    )
    out.loc[mask, "close"] = sub_close
    out.loc[mask, "close_raw"] = raw
    return out, symbols


def _numbers(raw: pd.DataFrame, col: str | None, default: float) -> pd.Series:
    if col is None:
        return pd.Series(default, index=raw.index)
    values = pd.to_numeric(raw[col].replace("", np.nan), errors="coerce")
    return values.fillna(default)


def parse_split_ratio(value: object) -> float:
    """`7`, `7.0`, `7:1`, `7/1`, `7-for-1`, `1 for 10` -> new shares per old share; blank -> 1."""
    text = str(value).strip().lower()
    if text in ("", "nan", "none"):
        return 1.0
    m = re.fullmatch(r"([\d.]+)\s*(?::|/|-?\s*for\s*-?)\s*([\d.]+)", text)
    if m:
        return float(m.group(1)) / float(m.group(2))
    try:
        return float(text)
    except ValueError as exc:
        raise ValueError(f"split ratio {value!r} is not a number or `a:b`") from exc


# --------------------------------------------------------------------------------------------
# Splits without factors

# Common split ratios (new shares per old share); a reverse split is the reciprocal.
SPLIT_RATIOS: tuple[float, ...] = (
    1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 50.0,
)  # fmt: skip


def return_breaks(
    breaks: list[list[str]] | list[tuple[str, str]], symbols: np.ndarray, sessions: np.ndarray
) -> np.ndarray:
    """(n x T) bool mask of the returns kept out of the model: one (symbol, date) per
    return the cleaning stage or the user left out at ingest (the return INTO that session)."""
    mask = np.zeros((len(symbols), len(sessions)), dtype=bool)
    for i, j in break_cells(breaks, symbols, sessions):
        mask[i, j] = True
    return mask


def break_cells(
    breaks: list[list[str]] | list[tuple[str, str]], symbols: np.ndarray, sessions: np.ndarray
) -> set[tuple[int, int]]:
    """The (row, session) cells of the breaks that fall on `symbols` and `sessions` (what
    `return_breaks` marks; a tail build counts them over the whole calendar without a mask)."""
    row = {s: i for i, s in enumerate(np.asarray(symbols).tolist())}
    col = {d: j for j, d in enumerate(np.asarray(sessions).astype("datetime64[D]").tolist())}
    cells = set()
    for sym, date in breaks:
        i = row.get(sym)
        j = col.get(np.datetime64(date, "D").astype(object))
        if i is not None and j is not None:
            cells.add((i, j))
    return cells
