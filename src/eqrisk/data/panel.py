"""The dense panel (symbols x sessions) the model reads, and the columns of the price rows.

The ingested data set on disk (`eqrisk.data.ingested`) is read into a `Panel` one symbol block
at a time (`fill_panel`), or from one long frame (`to_panel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from eqrisk.data.calendar import sessions_between
from eqrisk.data.share_classes import company_caps, read_share_classes

PRICE_COLUMNS = [
    "date",
    "symbol",
    "close",
    "open",
    "high",
    "low",
    "close_raw",
    "volume",
    "market_cap",
]
RAW_MASTER_COLUMNS = ["symbol", "name", "asset_type", "gics_sector", "gics_sub_industry", "shares"]
PANEL_FIELDS = ("close", "open", "high", "low", "close_raw", "volume", "market_cap")
# What the model needs of the whole universe at once: the returns (from the adjusted close) and
# the caps (group weights, the cap rank, a company's classes summed). The other fields are only
# stored and read off row by row, so a full build reads them one block of rows at a time.
MODEL_FIELDS = ("close", "market_cap")


# A data set or snapshot that would replace one with fewer than this share of its symbols or
# sessions is refused unless the operator insists (`ingest --replace`, `build --force`).
SHRINK_LIMIT = 0.5


def shrink_reason(
    old: tuple[int, int], new: tuple[int, int], *, limit: float = SHRINK_LIMIT
) -> str | None:
    """Why `new` (symbols, sessions) is a sharp shrink of `old`, or None when it is not.

    One rule for ingest and build: losing more than half of the symbols or of the sessions is
    far more often a wrong file than a wish.
    """
    parts = [
        f"{n_new} {what} against {n_old}"
        for what, n_old, n_new in zip(("symbols", "sessions"), old, new, strict=True)
        if n_old > 0 and n_new < limit * n_old
    ]
    if not parts:
        return None
    return f"{' and '.join(parts)} (less than {limit:.0%} of the existing)"


@dataclass(frozen=True)
class Panel:
    """Dense arrays (n_symbols x n_sessions), C-contiguous along time; NaN = no observation."""

    symbols: np.ndarray  # (n,) str
    sessions: np.ndarray  # (T,) datetime64[D]
    close: np.ndarray  # adjusted close
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close_raw: np.ndarray
    volume: np.ndarray
    market_cap: np.ndarray
    # The fields that hold the data; the others (a panel read for the model only, see
    # MODEL_FIELDS) are read-only all-NaN views that take no memory: `require` before use.
    read: tuple[str, ...] = PANEL_FIELDS
    # The first session the fields beyond MODEL_FIELDS hold: they are (n x (T - others_from))
    # arrays of sessions others_from.. (a tail build reads them from its first digested
    # chunk's year only); 0: every session. Read them through `field`.
    others_from: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.close.shape

    def field(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Sessions lo..hi - 1 (hi None: to the end) of field `name`, a view (all of them: the
        field itself), whichever sessions the panel holds it for; sessions it does not hold
        are an error."""
        arr: np.ndarray = getattr(self, name)
        if name in MODEL_FIELDS or not self.others_from:
            # every session asked: the field as it is (a spliced field stays unread)
            return arr if lo == 0 and hi is None else arr[:, lo:hi]
        hi = self.shape[1] if hi is None else hi
        if lo < self.others_from:
            raise ValueError(
                f"the panel holds {name} from session {self.others_from} on, not from {lo}"
            )
        return arr[:, lo - self.others_from : hi - self.others_from]

    @property
    def unread(self) -> tuple[str, ...]:
        """The fields this panel was read without (all-NaN views)."""
        return tuple(name for name in PANEL_FIELDS if name not in self.read)

    def require(self, *names: str) -> None:
        """Raise when one of `names` was not read into this panel."""
        missing = [name for name in names if name not in self.read]
        if missing:
            raise ValueError(f"the panel was read without {', '.join(missing)}")

    def index_of(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.symbols.tolist())}


@dataclass(frozen=True)
class Cells:
    """Price rows of one piece of a data set, as arrays: each row's symbol as a code into
    `names`, its session (datetime64[D]) and its values per panel field (NaN: none)."""

    names: np.ndarray  # (k,) str
    codes: np.ndarray  # (m,) int
    days: np.ndarray  # (m,) datetime64[D]
    values: dict[str, np.ndarray]

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Cells:
        codes, names = pd.factorize(frame["symbol"].astype(str))
        days = pd.DatetimeIndex(pd.to_datetime(frame["date"])).normalize()
        values = {
            field: pd.to_numeric(frame[field], errors="coerce").to_numpy(float)
            for field in PANEL_FIELDS
            if field in frame.columns
        }
        return cls(np.asarray(names, dtype=object), codes, days.to_numpy().astype("datetime64[D]"),
                   values)  # fmt: skip


def to_panel(
    prices: pd.DataFrame,
    master: pd.DataFrame | None = None,
    share_classes: dict[str, str] | None = None,
) -> Panel:
    """Pivot a long price frame onto the NYSE sessions between its first and last date
    (`fill_panel` with the frame as its one piece)."""
    dates = pd.to_datetime(prices["date"])
    symbols = np.array(sorted(prices["symbol"].unique()), dtype=object)
    span = (dates.min(), dates.max())
    return fill_panel([Cells.of(prices)], symbols, span, master, share_classes)


def fill_panel(
    pieces: Iterable[Cells],
    symbols: np.ndarray,
    span: tuple[pd.Timestamp, pd.Timestamp],
    master: pd.DataFrame | None = None,
    share_classes: dict[str, str] | None = None,
    fields: tuple[str, ...] = PANEL_FIELDS,
    others_since: pd.Timestamp | None = None,
) -> Panel:
    """The panel of `symbols` (sorted) on the NYSE sessions of `span` (first, last), filled
    from pieces of price rows one at a time (only one piece in memory beside the panel).
    `fields`: the fields read (MODEL_FIELDS at least); the others are all-NaN views.
    `others_since`: the fields beyond MODEL_FIELDS held from that day's session on only
    (`Panel.others_from`; the pieces' rows before it are not read for them).

    Market cap: the row's `market_cap` where given, else shares (from the master) x adjusted
    close. A master's share count is one number, today's; the adjusted close is today's price
    scaled back through splits, so their product is the cap history without split jumps (raw
    close x today's shares would overstate every pre-split cap by the split ratio). Share
    classes of one company (`share_classes`, symbol -> company; None: the project's map) count
    the company's cap once (`share_classes.company_caps`).
    """
    if not set(MODEL_FIELDS) <= set(fields) <= set(PANEL_FIELDS):
        raise ValueError(f"a panel reads {MODEL_FIELDS} at least, of {PANEL_FIELDS}")
    sessions = sessions_between(pd.Timestamp(span[0]), pd.Timestamp(span[1]))
    session_days = sessions.to_numpy().astype("datetime64[D]")
    others_from = 0
    if others_since is not None:
        day = np.datetime64(pd.Timestamp(others_since).date(), "D")
        others_from = int(np.searchsorted(session_days, day))
    arrays = fill_rows(pieces, symbols, session_days, fields, others_from=others_from)
    if master is not None and "shares" in master.columns:
        shares = (
            pd.to_numeric(master.set_index("symbol")["shares"], errors="coerce")
            .reindex(symbols)
            .to_numpy(float)
        )
        close, cap = arrays["close"], arrays["market_cap"]
        for lo in range(0, len(symbols), 1024):  # row slices: no second n x T array
            part = slice(lo, lo + 1024)
            cap[part] = np.where(np.isnan(cap[part]), shares[part, None] * close[part], cap[part])
    classes = read_share_classes() if share_classes is None else share_classes
    arrays["market_cap"] = company_caps(arrays["market_cap"], symbols, classes, copy=False)
    n, n_t = len(symbols), len(session_days)
    unread = {
        k: np.broadcast_to(np.float64(np.nan), (n, n_t if k in MODEL_FIELDS else n_t - others_from))
        for k in PANEL_FIELDS
    }
    return Panel(
        symbols=symbols,
        sessions=session_days,
        **{k: np.ascontiguousarray(arrays[k]) if k in arrays else unread[k] for k in PANEL_FIELDS},
        read=tuple(k for k in PANEL_FIELDS if k in fields),
        others_from=others_from,
    )


def session_columns(session_days: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Each day's column among the sorted `session_days` (datetime64[D]), -1 for a day that is
    none of them (NaT included): a table of the calendar days they span, looked up in one
    gather rather than a binary search a row."""
    if not len(session_days):
        return lambda days: np.full(len(days), -1, dtype=np.int64)
    first = session_days[0]
    span = int((session_days[-1] - first).astype(np.int64)) + 1
    table = np.full(span, -1, dtype=np.int64)
    table[(session_days - first).astype(np.int64)] = np.arange(len(session_days))

    def columns(days: np.ndarray) -> np.ndarray:
        offset = (np.asarray(days, dtype="datetime64[D]") - first).astype(np.int64)
        if len(offset) and offset.min() >= 0 and offset.max() < span:
            found: np.ndarray = table[offset]
            return found
        inside = (offset >= 0) & (offset < span)
        out = np.full(len(offset), -1, dtype=np.int64)
        out[inside] = table[offset[inside]]
        return out

    return columns


def fill_rows(
    pieces: Iterable[Cells],
    symbols: np.ndarray,
    session_days: np.ndarray,
    fields: tuple[str, ...],
    *,
    others: bool = False,
    others_from: int = 0,
) -> dict[str, np.ndarray]:
    """`fields` of `symbols` x `session_days` (NaN: no row), filled from pieces of price rows
    one at a time. A row of a symbol outside `symbols` is an error, or skipped with `others`
    (a block of rows read from files that hold other symbols too). `others_from`: the fields
    beyond MODEL_FIELDS of sessions others_from.. only (`Panel.others_from`)."""
    sym_idx = pd.Index(symbols)
    shape = (len(symbols), len(session_days))
    narrow = (shape[0], shape[1] - others_from)
    arrays = {
        field: np.full(shape if field in MODEL_FIELDS else narrow, np.nan) for field in fields
    }
    column_of = session_columns(session_days)
    for piece in pieces:
        where = sym_idx.get_indexer(pd.Index(piece.names))
        if (where < 0).any() and not others:
            raise ValueError("price rows of a symbol outside the panel")
        rows = where[piece.codes]
        cols = column_of(piece.days)
        ok = cols >= 0
        if not ok.all():
            bad = np.unique(piece.days[~ok])[:5]
            raise ValueError(
                f"prices hold dates that are not NYSE sessions: {[str(d) for d in bad]}"
            )
        mine = rows >= 0
        if not mine.all():
            rows, cols = rows[mine], cols[mine]
        late = cols >= others_from
        whole = bool(late.all())  # every row in the narrow fields' sessions too
        # One flat index per width: a 1-D scatter is about twice as fast as numpy's 2-D
        # (rows, cols) indexing, which works the flat offsets out again for each field.
        flat = rows * shape[1] + cols
        if not others_from:
            flat_narrow = flat
        elif whole:
            flat_narrow = rows * narrow[1] + (cols - others_from)
        else:
            flat_narrow = rows[late] * narrow[1] + (cols[late] - others_from)
        for field in fields:
            if field in piece.values:
                values = piece.values[field] if mine.all() else piece.values[field][mine]
                if field in MODEL_FIELDS:
                    arrays[field].reshape(-1)[flat] = values
                else:
                    arrays[field].reshape(-1)[flat_narrow] = values if whole else values[late]
    return arrays
