"""Row validation of newly read prices (one rejection bit per reason), and the rejected and
flagged tables written next to the report."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data import panel
from eqrisk.data.calendar import is_session
from eqrisk.data.ingest_report import MAX_EXAMPLES, ROW_BIT, ROW_CODES


def date_str(values: np.ndarray) -> np.ndarray:
    return np.datetime_as_string(values.astype("datetime64[D]"), unit="D")


_PRICES = ("close", "open", "high", "low", "close_raw")


def row_examples(
    frame: pd.DataFrame,
    rows: np.ndarray,
    detail: bool = False,
    bounds: tuple[float, float] = (0.0, np.inf),
) -> list[dict[str, Any]]:
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
                    for c in panel.PRICE_COLUMNS[2:]
                    if pd.notna(rec[c])
                    and (
                        rec[c] < 0
                        if c == "volume"
                        else rec[c] <= 0 or (c in _PRICES and not bounds[0] <= rec[c] <= bounds[1])
                    )
                )
        out.append(ex)
    return out


# The accepted symbols (docs/decisions/ingest.md): a letter, digit or ^ (an index, ^GSPC), then
# letters, digits and . - / ^ _ (BRK.B, BF-B, RDS/A), at most 20 in all. So no markup (<, >, &),
# no formula prefix (=, +, -, @ first), no space, quote, control character or NUL.
SYMBOL_PATTERN = re.compile(r"[A-Z0-9^][A-Z0-9.\-/^_]{0,19}")


def bad_symbols(symbols: np.ndarray) -> np.ndarray:
    """True for each non-empty symbol outside SYMBOL_PATTERN (checked once per distinct one)."""
    codes, uniques = pd.factorize(pd.Series(symbols, dtype=object).fillna(""))
    bad = np.array(
        [s != "" and SYMBOL_PATTERN.fullmatch(str(s)) is None for s in uniques], dtype=bool
    )
    return bad[codes] if len(bad) else np.zeros(len(symbols), dtype=bool)


def validate_rows(
    frame: pd.DataFrame, bounds: tuple[float, float] = (0.0, np.inf)
) -> tuple[np.ndarray, dict[int, int]]:
    """Rejection flags (bit per code of ROW_CODES) of each row of the new price rows, and for
    each duplicate row the position of the row that is kept in its place. A positive price
    outside `bounds` (min, max) is PRICE_OUT_OF_RANGE."""
    n = len(frame)
    flags = np.zeros(n, dtype=np.uint16)
    flags[(frame["symbol"] == "").to_numpy()] |= ROW_BIT["MISSING_SYMBOL"]
    flags[bad_symbols(frame["symbol"].to_numpy())] |= ROW_BIT["BAD_SYMBOL"]
    dates = frame["date"]
    bad_date = dates.isna().to_numpy()
    flags[bad_date] |= ROW_BIT["BAD_DATE"]
    if n:
        uniq = pd.Series(pd.unique(dates.dropna()))
        sessions = set(uniq[is_session(uniq).to_numpy()])
        not_session = ~bad_date & ~dates.isin(sessions).to_numpy()
        flags[not_session] |= ROW_BIT["NOT_A_SESSION"]
    non_numeric = np.zeros(n, dtype=bool)
    has_bad = frame["bad_cells"].notna().to_numpy()
    if has_bad.any():
        non_numeric[has_bad] = [
            any(k != "date" for k in b) for b in frame["bad_cells"].to_numpy()[has_bad]
        ]
    flags[non_numeric] |= ROW_BIT["NON_NUMERIC_PRICE"]
    flags[np.isnan(frame["close"].to_numpy()) & ~non_numeric] |= ROW_BIT["MISSING_PRICE"]
    with np.errstate(invalid="ignore"):
        non_pos = np.zeros(n, dtype=bool)
        for col in ("close", "open", "high", "low", "close_raw", "market_cap"):
            non_pos |= frame[col].to_numpy() <= 0
        non_pos |= frame["volume"].to_numpy() < 0
    flags[non_pos] |= ROW_BIT["NON_POSITIVE_PRICE"]
    with np.errstate(invalid="ignore"):
        outside = np.zeros(n, dtype=bool)
        for col in _PRICES:
            values = frame[col].to_numpy()
            outside |= (values > 0) & ((values < bounds[0]) | (values > bounds[1]))
    flags[outside] |= ROW_BIT["PRICE_OUT_OF_RANGE"]
    # Duplicates among the otherwise good rows: the first one (file order) is kept.
    good = np.flatnonzero(flags == 0)
    if len(good):
        sym_codes, _ = pd.factorize(frame["symbol"].to_numpy()[good])
        day = frame["date"].to_numpy()[good].astype("datetime64[D]").astype(np.int64)
        key = sym_codes.astype(np.int64) * 1_000_000 + (day - day.min())
        keys = pd.Series(key)
        dup = keys.duplicated(keep="first").to_numpy()
        if dup.any():
            flags[good[dup]] |= ROW_BIT["DUPLICATE_ROW"]
            first = pd.Series(good).groupby(key).transform("first").to_numpy()
            return flags, dict(zip(good[dup].tolist(), first[dup].tolist(), strict=True))
    return flags, {}


def _reason_strings(flags: np.ndarray) -> np.ndarray:
    out = np.empty(len(flags), dtype=object)
    for value in np.unique(flags):
        out[flags == value] = ";".join(c for c in ROW_CODES if value & ROW_BIT[c])
    return out


_REJECTED_COLUMNS = ["file", "row", *panel.PRICE_COLUMNS, "reason", "detail"]
_FLAGGED_COLUMNS = ["symbol", "date", "prev_close", "close", "return"]


def _number_text(value: float) -> str:
    """A float as short text: 1000.0 -> '1000', 101.5 -> '101.5'."""
    return np.format_float_positional(value, trim="-")


def rejected_frame(
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
        "date": np.where(np.isnat(dates), "", date_str(dates)).astype(object),
        "symbol": sub["symbol"].to_numpy(dtype=object),
    }
    for col in panel.PRICE_COLUMNS[2:]:
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


def large_moves(final: pd.DataFrame, is_new: np.ndarray, max_move: float) -> pd.DataFrame:
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
            "date": date_str(final["date"].to_numpy()[idx + 1]),
            "prev_close": close[idx],
            "close": close[idx + 1],
            "return": ret[idx],
        },
        columns=_FLAGGED_COLUMNS,
    )
