"""What a merge (`eqrisk update`, `ingest --merge`) keeps of the data set it merges into.

- The basis: the options of the first ingest that decide what a stored price or return means
  (`BASIS_OPTIONS`) are recorded in `meta.json` under `basis`, and every merge uses them; a
  merge that states another value refuses before anything is read (`basis_for`).
- The name: the data set keeps its first source's name; the files merged into it are listed
  under `merged_files` (`merged_meta`).
- Coverage: each new session's count of priced symbols against the session before it
  (`coverage`); a session far below it is refused unless the operator says it is partial.
- Nothing new: a merge whose rows and master equal the stored ones writes nothing (its rows
  are not `fresh_rows`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from eqrisk.data.ingest_report import IngestError
from eqrisk.data.panel import RAW_MASTER_COLUMNS

# Option name -> (the command line's flag, its default on a first ingest). Every option here is
# part of the data set's basis: recorded by the first ingest, used by every merge.
BASIS_OPTIONS: dict[str, tuple[str, Any]] = {
    "prices_basis": ("--prices", "auto"),
    "max_move": ("--max-move", 0.5),
    "keep_split_moves": ("--keep-split-moves", False),
    "columns": ("--column", {}),
    "date_format": ("--date-format", None),
}


class BasisConflict(IngestError):
    """A merge that states an option the data set was not ingested with."""


def _show(name: str, value: Any) -> str:
    flag = BASIS_OPTIONS[name][0]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    if isinstance(value, dict):
        return " ".join(f"{flag} {k}={v}" for k, v in sorted(value.items())) or f"no {flag}"
    return f"{flag} {value}"


def stored_basis(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The basis recorded with a data set; for one written before bases were recorded, the
    options its meta kept (`prices_basis`, `max_move`) and the defaults for the rest."""
    meta = meta or {}
    if isinstance(meta.get("basis"), dict):
        recorded = dict(meta["basis"])
    else:
        recorded = {k: meta[k] for k in ("prices_basis", "max_move") if k in meta}
    return {name: recorded.get(name, default) for name, (_, default) in BASIS_OPTIONS.items()}


def basis_for(given: dict[str, Any], meta: dict[str, Any] | None, *, merge: bool) -> dict[str, Any]:
    """The options an ingest runs with. A first ingest (or a replace): the given ones over the
    defaults. A merge into a data set: the recorded ones; a given option (not None) that
    differs raises BasisConflict naming what is recorded and how to re-ingest."""
    unknown = set(given) - set(BASIS_OPTIONS)
    if unknown:
        raise ValueError(f"not basis options: {sorted(unknown)}")
    if not merge or meta is None:
        return {
            name: default if given.get(name) is None else given[name]
            for name, (_, default) in BASIS_OPTIONS.items()
        }
    recorded = stored_basis(meta)
    clashes = [
        name
        for name, value in given.items()
        if value is not None and _normal(value) != _normal(recorded[name])
    ]
    if clashes:
        said = ", ".join(_show(n, given[n]) for n in clashes)
        kept = ", ".join(_show(n, recorded[n]) for n in clashes)
        source = meta.get("data_source", "the data set")
        wanted = {**recorded, **{n: given[n] for n in clashes}}
        redo = " ".join(
            _show(n, v) for n, v in wanted.items() if _normal(v) != _normal(BASIS_OPTIONS[n][1])
        )
        raise BasisConflict(
            f"refused: {source} was ingested with {kept}; this merge gives {said}. A merge "
            "keeps the data set's basis; to change it, re-ingest the whole history: "
            f"eqrisk ingest FILES {redo} --replace".replace("  ", " ").rstrip()
        )
    return recorded


def _normal(value: Any) -> Any:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    return value


def merged_meta(
    old: dict[str, Any] | None, files: list[str], given_source: str | None, first_source: str
) -> tuple[str, list[str]]:
    """(data_source, merged_files) of a merge: the stored name (unless one is given), and the
    files merged so far plus these."""
    if old is None:
        return given_source or first_source, []
    source = given_source or str(old.get("data_source") or first_source)
    return source, [*old.get("merged_files", []), *files]


@dataclass(frozen=True)
class SessionCoverage:
    """One new session: symbols with a price, against the session before it."""

    date: str
    symbols: int
    previous: int

    @property
    def share(self) -> float:
        return self.symbols / self.previous if self.previous else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"date": self.date, "symbols": self.symbols, "previous": self.previous,
                "share": round(self.share, 4)}  # fmt: skip


def coverage(counts: pd.Series, old_days: set[str]) -> list[SessionCoverage]:
    """Per session of the data set (`counts`: rows per session, sorted) that the stored data
    set did not have: how many symbols have a price, against the session before it (a first
    session counts against itself)."""
    days = np.asarray(counts.index.values).astype("datetime64[D]").astype(str)
    values = counts.to_numpy(dtype=np.int64)
    out = []
    for k, (day, n) in enumerate(zip(days, values, strict=True)):
        if day in old_days:
            continue
        previous = int(values[k - 1]) if k else int(n)
        out.append(SessionCoverage(str(day), int(n), previous))
    return out


def coverage_refusal(sessions: list[SessionCoverage], min_share: float) -> str | None:
    """Why an update's new sessions look partial, or None."""
    low = [s for s in sessions if s.share < min_share]
    if not low:
        return None
    first = low[0]
    return (
        f"refused: session {first.date} has prices for {first.symbols} of the {first.previous} "
        f"symbols the session before it had ({first.share:.0%}, below {min_share:.0%})"
        + (f", and {len(low) - 1} more session(s) as low" if len(low) > 1 else "")
        + "; a partial file would move the data set's date forward for a few symbols. Pass "
        "--partial to merge it anyway"
    )


def fresh_rows(new: pd.DataFrame, old: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Per row of `new`: True when its (symbol, date) is not in `old` or any of its values
    differs from the stored ones (NaN = NaN). Both frames: date as datetime64[ns]."""
    if new.empty:
        return np.zeros(0, dtype=bool)
    keys = ["symbol", "date"]
    left = new[columns].reset_index(drop=True)
    # Only the stored rows of the new rows' sessions can match: the join reads those alone
    # (a one-session merge: one session of the year or so of rows it was given).
    old = old.loc[old["date"].isin(new["date"].unique()).to_numpy(dtype=bool), columns]
    joined = left.merge(old, on=keys, how="left", suffixes=("", "_old"), indicator=True)
    fresh = (joined["_merge"] != "both").to_numpy().copy()
    for col in columns:
        if col in keys:
            continue
        a = pd.to_numeric(joined[col], errors="coerce").to_numpy(float)
        b = pd.to_numeric(joined[f"{col}_old"], errors="coerce").to_numpy(float)
        fresh |= ~((a == b) | (np.isnan(a) & np.isnan(b)))
    return fresh


def kept_breaks(
    breaks: list[list[str]],
    stored: list[list[str]],
    final: pd.DataFrame,
    judged: np.ndarray,
    decided: set[tuple[str, str]],
) -> list[list[str]]:
    """The returns a merge leaves out: the stage's verdicts (`breaks`) on the judged rows and
    the user's decisions (`decided` pairs), and the stored verdicts on every other pair."""
    rows = final.loc[np.asarray(judged, dtype=bool), ["symbol", "date"]]
    day = rows["date"].to_numpy().astype("datetime64[D]").astype(str)
    reopened = set(zip(rows["symbol"].astype(str), day, strict=True)) | decided
    kept = [[str(s), str(d)] for s, d in stored if (str(s), str(d)) not in reopened]
    return sorted(kept + [[str(s), str(d)] for s, d in breaks])


def cap_day(path: Path | None, last: str | None, cap_dates: dict[str, str]) -> str | None:
    """The session whose prices turn a file's market caps into share counts: the one recorded
    for the file's content (sha256) by the ingest that first read it, else the data's last
    (`last`); recorded in `cap_dates`. A file given again unchanged gives the same share
    counts."""
    if path is None or last is None:
        return None
    key = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return cap_dates.setdefault(key, last)


def same_master(new: pd.DataFrame, old: pd.DataFrame | None) -> bool:
    """The master to store equals the stored one (rows in symbol order, NaN = NaN)."""
    if old is None:
        return new.empty
    cols = RAW_MASTER_COLUMNS

    def norm(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.reindex(columns=cols).sort_values("symbol", ignore_index=True)
        out["shares"] = pd.to_numeric(out["shares"], errors="coerce").astype(float)
        return out.astype({c: object for c in cols[:-1]}).where(out.notna(), None)

    return norm(new).equals(norm(old))
