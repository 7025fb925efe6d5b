"""The security master file and the share-count file (`--shares`) -> canonical frames; share
counts are merged into the master's `shares`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from eqrisk.data import panel
from eqrisk.data.cells import (
    InputLimits,
    file_kind,
    fill_null,
    norm_name,
    parse_numeric,
    read_table,
    string_like,
)
from eqrisk.data.columns import (
    MASTER_ALIASES,
)
from eqrisk.data.ingest_report import MAX_EXAMPLES, IngestError, Issues
from eqrisk.data.master import ASSET_TYPES, current_gics, etf_registry, sector_table

ACCEPTED_MASTER_COLUMNS = (
    "`symbol` (or `ticker`, `Symbol`), optional `name` (or `Security`), `asset_type` (or `kind`: "
    "stock|etf|index), `gics_sector` (or `GICS Sector`), `gics_sub_industry` (or "
    "`GICS Sub-Industry`), `shares` or `market_cap` (or `market_cap_<date>`, `Market Cap`)"
)


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
    **MASTER_ALIASES,
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
    """A master file -> columns `panel.RAW_MASTER_COLUMNS` plus `market_cap`.

    `shares` and `market_cap` are floats (NaN where absent or not a positive number);
    `ingest()` turns a market cap into shares with the symbol's latest price. asset_type is
    stock|etf|index (empty: etf for the known ETFs, else stock; anything else: stock, reported);
    sector names are matched to the reference table case-insensitively.
    """
    return read_master_checked(Path(path), Issues())


def read_master_checked(
    path: Path, issues: Issues, limits: InputLimits | None = None
) -> pd.DataFrame:
    """`read_master`, its problems added to `issues`."""
    table, _ = read_table(path, limits=limits)
    names = [str(n) for n in table.column_names]
    chosen: dict[str, int] = {}
    for i, name in enumerate(names):
        canon = _master_canon(norm_name(name))
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
        col = pc.utf8_trim_whitespace(string_like(table.column(chosen[canon])))
        return pd.Series(fill_null(col, "").to_pylist(), dtype=object)

    frame = pd.DataFrame(
        {
            "symbol": text("symbol").str.upper(),
            "name": text("name"),
            "asset_type": text("asset_type").str.lower(),
            "gics_sector": text("gics_sector"),
            "gics_sub_industry": text("gics_sub_industry"),
        }
    )
    frame["row"] = np.arange(n) + (2 if file_kind(path) == "csv" else 1)
    for canon in ("shares", "market_cap"):
        if canon in chosen:
            col = table.column(chosen[canon])
            vals, missing, is_bad = parse_numeric(col)
            non_pos = ~missing & ~is_bad & (vals <= 0)
            bad = is_bad | non_pos
            if bad.any():
                raw = string_like(col).to_pylist()
                rows = np.flatnonzero(bad)
                issues.add(
                    "BAD_SHARES",
                    len(rows),
                    [{"symbol": frame["symbol"][r], canon: raw[r]} for r in rows[:MAX_EXAMPLES]],
                )
            frame[canon] = np.where(bad, np.nan, vals)
        else:
            frame[canon] = np.nan

    frame = _drop_bad_rows(frame, path, issues)
    frame = _check_types(frame, issues)
    for field in ("name", "gics_sector", "gics_sub_industry"):
        frame[field] = frame[field].where(frame[field] != "", None)
    frame = frame.reset_index(drop=True)
    return frame[[*panel.RAW_MASTER_COLUMNS, "market_cap"]]


def _drop_bad_rows(frame: pd.DataFrame, path: Path, issues: Issues) -> pd.DataFrame:
    """Master rows without a symbol, and repeats of a symbol (the first one is kept), dropped."""
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
    return frame


def _check_types(frame: pd.DataFrame, issues: Issues) -> pd.DataFrame:
    """Asset types (an empty one from the ETF registry, an unknown one -> stock) and sector names
    (matched case-insensitively to GICS; an unknown one is kept and reported)."""
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

    _rename_retired(frame, issues)
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
    return frame


def _rename_retired(frame: pd.DataFrame, issues: Issues) -> None:
    """GICS names retired since 2016 replaced by their current names (`gics_renames.csv`), each
    renamed symbol reported (GICS_RENAMED)."""
    examples: list[dict[str, str]] = []
    renamed = np.zeros(len(frame), dtype=bool)
    for column, level in (("gics_sector", "sector"), ("gics_sub_industry", "sub_industry")):
        old = frame[column].to_numpy(dtype=object)
        new = np.array([current_gics(level, str(v)) for v in old], dtype=object)
        hit = new != old
        for symbol, was, now in zip(frame["symbol"][hit], old[hit], new[hit], strict=True):
            examples.append({"symbol": symbol, "was": was, "now": now})
        renamed |= hit
        frame[column] = new
    issues.add("GICS_RENAMED", int(renamed.sum()), examples)


# --------------------------------------------------------------------------------------------
# Share counts (--shares): merged into the master's `shares`

_SHARES_ALIASES = {
    "symbol": "symbol",
    "ticker": "symbol",
    "shares": "shares",
    "shares_outstanding": "shares",
    "market_cap": "market_cap",
    "marketcap": "market_cap",
    "price": "price",
}
ACCEPTED_SHARES_COLUMNS = (
    "`symbol` (or `ticker`, `Symbol`) and `shares` (or `shares_outstanding`), or `market_cap` "
    "(or `Market Cap`) with `price` (shares = market_cap / price; without `price`, market_cap / "
    "the symbol's latest price); other columns ignored, so the S&P `constituents_financials` "
    "layout is read as is"
)


def read_shares(path: Path) -> pd.DataFrame:
    """A share-count file -> `symbol, shares, market_cap` (one of the two numbers per row).

    With `market_cap` and `price` the shares are their ratio (the file's own price, so that the
    count does not depend on when the file was made); `market_cap` alone is kept for `ingest()`
    to divide by the symbol's latest price.
    """
    return read_shares_checked(Path(path), Issues())


def read_shares_checked(
    path: Path, issues: Issues, limits: InputLimits | None = None
) -> pd.DataFrame:
    table, _ = read_table(path, limits=limits)
    chosen: dict[str, int] = {}
    for i, name in enumerate(table.column_names):
        canon = _SHARES_ALIASES.get(norm_name(str(name)))
        if canon is not None and canon not in chosen:
            chosen[canon] = i
    if "symbol" not in chosen or not ({"shares", "market_cap"} & set(chosen)):
        raise IngestError(
            f"{path}: not a share-count file (columns: {table.column_names[:12]}); accepted: "
            f"{ACCEPTED_SHARES_COLUMNS}"
        )
    symbols = pc.utf8_upper(pc.utf8_trim_whitespace(string_like(table.column(chosen["symbol"]))))
    frame = pd.DataFrame({"symbol": fill_null(symbols, "").to_pylist()}, dtype=object)
    numbers: dict[str, np.ndarray] = {}
    bad = np.zeros(len(frame), dtype=bool)
    for canon in ("shares", "market_cap", "price"):
        if canon in chosen:
            vals, missing, is_bad = parse_numeric(table.column(chosen[canon]))
            bad |= is_bad | (~missing & ~is_bad & (vals <= 0))
            numbers[canon] = vals
    if "shares" in numbers:
        shares, cap = numbers["shares"], np.full(len(frame), np.nan)
    else:  # market_cap / the file's price; a row without a price keeps its cap for later
        cap = numbers["market_cap"]
        shares = cap / numbers.get("price", np.full(len(frame), np.nan))
        cap = np.where(np.isnan(shares), cap, np.nan)
    frame["shares"] = np.where(bad, np.nan, shares)
    frame["market_cap"] = np.where(bad, np.nan, cap)
    issues.add(
        "BAD_SHARES",
        int(bad.sum()),
        [{"file": path.name, "symbol": s} for s in frame.loc[bad, "symbol"]],
        message="share-file count, market cap or price not a positive number: row ignored",
    )
    usable = (frame["symbol"] != "") & (frame["shares"].notna() | frame["market_cap"].notna())
    return frame[usable].drop_duplicates("symbol", keep="first").reset_index(drop=True)


def apply_shares(
    master: pd.DataFrame,
    counts: pd.DataFrame,
    prices: pd.DataFrame,
    path: Path,
    issues: Issues,
    on: str | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The master with the file's share counts (they win over the master's own); a market cap
    without a price is divided by the price on session `on` (default: the latest)."""
    out = master.copy()
    shares = counts.set_index("symbol")["shares"].copy()
    need = shares.isna()
    if need.any():  # market cap without a price: divide by the price on `on`
        last = last_prices(prices, on)
        caps = counts.set_index("symbol")["market_cap"]
        shares[need] = caps[need] / last.reindex(shares.index[need]).to_numpy(dtype=float)
    shares = shares[np.isfinite(shares.to_numpy(dtype=float))]
    found = out["symbol"].map(shares)
    hit = found.notna()
    out["shares"] = pd.to_numeric(out["shares"], errors="coerce").astype(float)
    out.loc[hit, "shares"] = found[hit].astype(float)
    unmatched = sorted(set(counts["symbol"]) - set(out["symbol"]))
    issues.add("SHARES_UNMATCHED", len(unmatched), unmatched)
    summary = {
        "file": str(path),
        "rows": len(counts),
        "symbols_with_shares": int(hit.sum()),
        "unmatched": len(unmatched),
    }
    return out, summary


def last_prices(final: pd.DataFrame, on: str | None = None) -> pd.Series:
    """Latest price per symbol of a frame sorted by (symbol, date), on or before session `on`
    (ISO day; default: the last): raw close, else close."""
    if on is not None:
        final = final[final["date"] <= pd.Timestamp(on)]
    if final.empty:
        return pd.Series(dtype=float)
    last = final.drop_duplicates("symbol", keep="last")
    base = last["close_raw"].where(last["close_raw"].notna(), last["close"])
    return pd.Series(base.to_numpy(), index=last["symbol"].to_numpy())
