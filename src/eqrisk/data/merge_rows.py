"""The rows an ingest works on: its new rows over the stored ones it needs.

A first ingest, a replace, or a merge that must see the whole history (`whole_reasons`) works on
every row. Any other merge reads only:

- the partitions (symbol block x year) its rows fall in, whole: the rows it writes back;
- every stored row from `CONTEXT_SESSIONS` sessions before its first new session to
  `AFTER_SESSIONS` after its last: what the cleaning stage reads around a judged move (the
  stock's last 63 returns and volumes, the same day's group and co-movers, the next sessions);
- for a symbol with fewer than `MIN_HISTORY` rows in that window but older ones, its history.

So the verdicts, flags and coverage of a merge of one session equal those of the same merge
over the whole history, and it reads about one year of prices, whatever the history's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from eqrisk.data import ingested, panel
from eqrisk.data.daily import fresh_rows
from eqrisk.data.ingested import Stored

# Sessions of stored rows read before a merge's first new session: twice the cleaning stage's
# 63-return lookback, so that a stock trading on most days has its full lookback.
CONTEXT_SESSIONS = 130
# Sessions read after its last new session (the stage's 5-session horizon and 3-return run).
AFTER_SESSIONS = 10
# A symbol with fewer stored rows than this before its first new row in the window gets its
# older rows read too (lookback + 2).
MIN_HISTORY = 65


@dataclass
class Combined:
    """The rows the stages see, sorted by (symbol, date): `_new` marks this ingest's rows,
    `_fresh` those of them that add a (symbol, date) or change its values, `_own` the rows the
    write stores (every row, or those of the partitions the merge touches). `base`: the stored
    set a windowed merge writes over (None: the rows are the whole data set)."""

    frame: pd.DataFrame
    old_days: set[str]
    base: Stored | None
    block_symbols: int

    def placed(self, final: pd.DataFrame) -> ingested.Placed:
        """The rows this ingest writes, dealt into partitions, with the statistics of the data
        set they make (`final`: the frame as the stages left it, same rows)."""
        own = final.loc[final["_own"].to_numpy(dtype=bool), panel.PRICE_COLUMNS]
        return ingested.place(own, self.base, self.block_symbols)


def whole_reasons(
    found: Stored | None,
    *,
    rejudge: bool,
    decisions: bool,
    shares: bool,
    master_caps: bool,
    whole: bool,
) -> list[str]:
    """Why a merge reads and rewrites the whole data set (empty: it reads a window)."""
    reasons = {
        "no partitioned data set": found is None or found.legacy,
        "--rejudge": rejudge,
        "return decisions (an adjustment rescales a whole history)": decisions,
        "a share-count file": shares,
        "master market caps (share counts at the last price)": master_caps,
        "asked": whole,
    }
    return [why for why, applies in reasons.items() if applies]


def _stored_frame(rows: pd.DataFrame) -> pd.DataFrame:
    old = rows.reindex(columns=panel.PRICE_COLUMNS)
    old["date"] = pd.to_datetime(old["date"]).astype("datetime64[ns]")
    old["symbol"] = old["symbol"].astype(object)
    return old


def combine(new: pd.DataFrame, found: Stored | None, window: bool, block_symbols: int) -> Combined:
    """`new` (the kept rows, split-adjusted) over the stored set `found` (None: a first ingest
    or a replace): every stored row, or (`window`) what a windowed merge reads. The data set
    keeps its symbols per block; a new one (or one written before partitions) gets
    `block_symbols`."""
    new = new.assign(_new=True, _fresh=True, _own=True)
    if found is None:
        return Combined(_sort(new), set(), None, block_symbols)
    size = block_symbols if found.legacy else found.block_symbols
    base = found if window and not found.legacy else None
    old = _window(new, found) if base is not None else found.read().assign(_own=True)
    old = _stored_frame(old).assign(_own=old["_own"].to_numpy(dtype=bool))
    days = found.stats.sessions().index
    old_days = set(np.asarray(days.values).astype("datetime64[D]").astype(str))
    if len(old):
        new = new.assign(_fresh=fresh_rows(new, old, panel.PRICE_COLUMNS))
        both = pd.concat([new, old.assign(_new=False, _fresh=False)], ignore_index=True)
        new = both[~both.duplicated(["symbol", "date"], keep="first")]
    return Combined(_sort(new), old_days, base, size)


def _window(new: pd.DataFrame, found: Stored) -> pd.DataFrame:
    """The stored rows a windowed merge of `new` reads (column `_own`: of a partition it
    touches)."""
    blocks = ingested.assign_blocks(
        list(new["symbol"].unique()), found.stats.blocks(), found.block_symbols
    )
    placed = ingested.with_parts(new[["symbol", "date"]], blocks)
    pairs = placed[["block", "year"]].drop_duplicates().to_numpy()
    parts = {(int(b), int(y)) for b, y in pairs}
    stored_parts = set(found.stats.parts())
    touched = found.read(sorted(parts & stored_parts)).assign(_own=True)
    sessions = found.stats.sessions().index
    first, last = pd.Timestamp(new["date"].min()), pd.Timestamp(new["date"].max())
    lo = max(int(sessions.searchsorted(first)) - CONTEXT_SESSIONS, 0)
    hi = min(int(sessions.searchsorted(last, side="right")) + AFTER_SESSIONS, len(sessions) - 1)
    start, end = (sessions[lo], sessions[hi]) if len(sessions) else (first, last)
    around = sorted(p for p in stored_parts - parts if start.year <= p[1] <= end.year)
    context = found.read(around, start=start)
    context = context.loc[context["date"] <= end].assign(_own=False)
    rows = pd.concat([touched, context], ignore_index=True)
    early = _short_histories(new, rows, found, start)
    if early:
        older = [p for p in stored_parts if p[1] <= start.year and p[0] in {
            blocks[s] for s in early}]  # fmt: skip
        history = found.read(sorted(older), symbols=sorted(early))
        history = history.loc[history["date"] < start].assign(_own=False)
        rows = pd.concat([rows, history], ignore_index=True)
        rows = rows[~rows.duplicated(["symbol", "date"], keep="first")]
    return rows


def _short_histories(
    new: pd.DataFrame, rows: pd.DataFrame, found: Stored, start: pd.Timestamp
) -> list[str]:
    """Symbols of `new` with fewer than MIN_HISTORY rows of `rows` before their first new row
    while the stored set holds rows of theirs before `start`."""
    firsts = new.groupby("symbol")["date"].min()
    began = found.stats.symbols().set_index("symbol")["first"].reindex(firsts.index)
    older = firsts.index[(began < start).to_numpy(dtype=bool)]  # (none stored: NaT, not older)
    if not len(older):
        return []
    # Each row's symbol as its place in `older` (-1: another), its rows before its first new
    # one counted, vectorised.
    at = pd.Index(older).get_indexer(rows["symbol"])
    mine = at >= 0
    first = firsts.reindex(older).to_numpy()
    before = rows["date"].to_numpy()[mine] < first[at[mine]]
    counts = np.bincount(at[mine][before], minlength=len(older))
    return [str(s) for s in older[counts < MIN_HISTORY]]


def _sort(frame: pd.DataFrame) -> pd.DataFrame:
    codes, _ = pd.factorize(frame["symbol"], sort=True)
    day = frame["date"].to_numpy().astype("datetime64[D]").astype(np.int64)
    order = np.lexsort((day, codes))
    return frame.iloc[order].reset_index(drop=True)


def previous_master(home: Path) -> pd.DataFrame | None:
    found = ingested.stored(home)
    return ingested.read_master(found) if found is not None else None
