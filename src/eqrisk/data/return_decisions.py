"""The return decisions a user feeds back: keep, drop or adjust the return of a symbol on a date.

Ingest writes every return the cleaning stage examined to `return_decisions.csv` in its report
folder (`eqrisk.data.return_cleaning`). A user edits its `action` (and `factor`) and passes the
file back with `eqrisk ingest --return-decisions FILE`: the file's decisions win over the
stage's, are stored with the data set and stay in force on later merges.

- `keep`: the return stays in the model whatever the stage found;
- `drop`: the return is left out of the model (null, like a missing price's);
- `adjust` with `factor` f: every price of the symbol before `date` is multiplied by f (a
  corporate-actions factor: 0.5 for a 2:1 split, 0.43 for a spin-off that kept 43% of the
  value), so the return into `date` becomes P_t / (f P_t-1) - 1 and stays in the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ACTIONS: tuple[str, ...] = ("keep", "drop", "adjust")
ACCEPTED_DECISION_COLUMNS = (
    "`symbol`, `date` (YYYY-MM-DD: the session the return goes into), `action` (keep, drop or "
    "adjust) and, for adjust, `factor` (a number > 0 multiplying the prices before `date`); "
    "other columns are ignored"
)


@dataclass(frozen=True)
class Decision:
    """One user decision on the return into `date` (ISO day) of `symbol`."""

    symbol: str
    date: str
    action: str
    factor: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "date": self.date, "action": self.action,
                "factor": self.factor}  # fmt: skip


def read_decisions(path: Path) -> list[Decision]:
    """The decisions of a CSV file; ValueError (one line, with the file's line numbers) for a
    file that is not one."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such return-decisions file")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise ValueError(
            f"{path}: not a CSV file ({exc}); accepted: {ACCEPTED_DECISION_COLUMNS}"
        ) from exc
    names = {re.sub(r"[\s\-]+", "_", str(c).strip().lower()): str(c) for c in raw.columns}
    missing = [c for c in ("symbol", "date", "action") if c not in names]
    if missing:
        raise ValueError(
            f"{path}: no column {', '.join(missing)}; accepted: {ACCEPTED_DECISION_COLUMNS}"
        )
    symbol = raw[names["symbol"]].str.strip().str.upper()
    day = pd.to_datetime(raw[names["date"]].str.strip(), format="%Y-%m-%d", errors="coerce")
    action = raw[names["action"]].str.strip().str.lower()
    factor_text = (
        raw[names["factor"]].str.strip() if "factor" in names else pd.Series("", index=raw.index)
    )
    factor = pd.Series(pd.to_numeric(factor_text.to_numpy(dtype=object), errors="coerce"),
                       index=raw.index, dtype=np.float64)  # fmt: skip
    problems = [
        (symbol == "", "no symbol"),
        (day.isna(), "date is not YYYY-MM-DD"),
        (~action.isin(ACTIONS), f"action is not one of {', '.join(ACTIONS)}"),
        ((action == "adjust") & ~((factor > 0) & np.isfinite(factor)), "adjust needs a factor > 0"),
    ]
    for bad, why in problems:
        if bad.any():
            lines = (np.flatnonzero(bad.to_numpy()) + 2).tolist()[:5]
            raise ValueError(f"{path}: {why} on line(s) {lines}; accepted: "
                             f"{ACCEPTED_DECISION_COLUMNS}")  # fmt: skip
    frame = pd.DataFrame(
        {
            "symbol": symbol,
            "date": day.dt.strftime("%Y-%m-%d"),
            "action": action,
            "factor": np.where(action == "adjust", factor, 1.0),
        }
    )
    clash = frame.duplicated(["symbol", "date"], keep=False) & ~frame.duplicated(keep=False)
    if clash.any():
        lines = (np.flatnonzero(clash.to_numpy()) + 2).tolist()[:5]
        raise ValueError(
            f"{path}: two different decisions for one symbol and date on lines {lines}"
        )
    frame = frame.drop_duplicates(["symbol", "date"])
    return [Decision(s, d, a, float(f)) for s, d, a, f in frame.itertuples(index=False, name=None)]


def decisions_from_meta(items: list[dict[str, Any]] | None) -> list[Decision]:
    """The decisions stored with an ingested data set."""
    return [
        Decision(str(i["symbol"]), str(i["date"]), str(i["action"]), float(i.get("factor", 1.0)))
        for i in items or []
    ]


def merged(old: list[Decision], new: list[Decision]) -> list[Decision]:
    """The decisions in force: the new ones, and the old ones for (symbol, date) they leave."""
    given = {(d.symbol, d.date) for d in new}
    out = [d for d in old if (d.symbol, d.date) not in given] + list(new)
    return sorted(out, key=lambda d: (d.symbol, d.date))


def price_factors(
    symbol: np.ndarray,
    day: np.ndarray,
    new_row: np.ndarray,
    decisions: list[Decision],
    applied: list[Decision],
) -> np.ndarray:
    """Per row, the multiplier that brings its close to the adjustments in force: an `adjust`
    of factor f scales the symbol's rows before its date by f. Rows already stored
    (`new_row` false) carry the `applied` adjustments of the ingest that stored them, so they
    get only the change (f_new / f_old); new rows get the whole factor."""
    target = {(d.symbol, d.date): d.factor for d in decisions if d.action == "adjust"}
    before = {(d.symbol, d.date): d.factor for d in applied if d.action == "adjust"}
    out = np.ones(len(symbol))
    if not target and not before:
        return out
    days = np.asarray(day).astype("datetime64[D]")
    keys = sorted(set(target) | set(before))
    rows_of = pd.Series(np.arange(len(days))).groupby(np.asarray(symbol, dtype=object)).indices
    for sym, date in keys:
        at = np.asarray(rows_of.get(sym, []), dtype=np.int64)
        rows = at[days[at] < np.datetime64(date, "D")]
        f_new, f_old = target.get((sym, date), 1.0), before.get((sym, date), 1.0)
        out[rows] *= np.where(new_row[rows], f_new, f_new / f_old)
    return out
