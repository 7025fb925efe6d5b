"""The ingested data set on disk, and the dense panel (symbols x sessions) the model reads.

`eqrisk ingest` writes `<home>/ingested/{prices.parquet, master.parquet, meta.json}` as a new
folder (`.ingest-new-<pid>-*`) swapped into place by two renames (the old one to
`.ingest-old-<pid>`, the new one to `ingested`); a writer killed between them leaves the old set
beside, and the next reader or writer (`recover_ingested`) puts it back. `eqrisk build` reads
the data set back as a `Panel`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

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

_PRICE_FIELDS: list[tuple[str, pa.DataType]] = [("date", pa.date32()), ("symbol", pa.string())]
_PRICE_SCHEMA = pa.schema(_PRICE_FIELDS + [(c, pa.float64()) for c in PRICE_COLUMNS[2:]])


# A data set or snapshot that would replace one with fewer than this share of its symbols or
# sessions is refused unless the operator insists (`ingest --replace`, `build --force`).
SHRINK_LIMIT = 0.5


def ingested_dir(home: Path) -> Path:
    return home / "ingested"


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


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_pid(folder: Path) -> int | None:
    parts = folder.name.split("-")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def recover_ingested(home: Path) -> None:
    """Finish what a writer killed in the middle left (a running writer's folders are left
    alone): a set moved aside (`.ingest-old-<pid>`) goes back to `ingested/` when there is no
    `ingested/`, else it is removed; a half-written new set (`.ingest-new-<pid>-*`) is removed."""
    home = Path(home)
    if not home.is_dir():
        return
    target = ingested_dir(home)
    for folder in sorted(home.glob(".ingest-*")):
        pid = _writer_pid(folder)
        if pid is None or _alive(pid) or not folder.is_dir():
            continue
        if folder.name.startswith(".ingest-old-") and not target.exists():
            folder.rename(target)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def ingested_counts(home: Path) -> tuple[int, int] | None:
    """(symbols, sessions) of the ingested data set, or None when there is none."""
    recover_ingested(home)
    folder = ingested_dir(home)
    if not (folder / "prices.parquet").exists():
        return None
    counts = json.loads((folder / "meta.json").read_text()).get("counts", {})
    if "symbols" in counts and "sessions" in counts:
        return int(counts["symbols"]), int(counts["sessions"])
    table = pq.read_table(folder / "prices.parquet", columns=["date", "symbol"])
    return len(table["symbol"].unique()), len(table["date"].unique())


def ingested_source(home: Path) -> str | None:
    """The `data_source` of the ingested data set, or None when there is none."""
    recover_ingested(home)
    meta = ingested_dir(home) / "meta.json"
    if not meta.exists():
        return None
    return str(json.loads(meta.read_text()).get("data_source", "unknown"))


def write_ingested(
    home: Path, prices: pd.DataFrame, master: pd.DataFrame, meta: dict[str, Any]
) -> Path:
    """Replace the ingested data set: readers see the old one or the new one, whole; a kill at
    any point leaves one of them (`recover_ingested` restores a set left aside)."""
    target = ingested_dir(home)
    home.mkdir(parents=True, exist_ok=True)
    recover_ingested(home)
    tmp = Path(tempfile.mkdtemp(prefix=f".ingest-new-{os.getpid()}-", dir=home))
    try:
        frame = prices.reindex(columns=PRICE_COLUMNS).sort_values(["symbol", "date"])
        frame["date"] = pd.to_datetime(frame["date"]).dt.date
        table = pa.Table.from_pandas(frame, schema=_PRICE_SCHEMA, preserve_index=False)
        pq.write_table(table, tmp / "prices.parquet", compression="zstd")
        raw = master.reindex(columns=RAW_MASTER_COLUMNS)
        raw["shares"] = pd.to_numeric(raw["shares"], errors="coerce")
        for col in RAW_MASTER_COLUMNS[:-1]:
            raw[col] = raw[col].astype("string")
        raw.to_parquet(tmp / "master.parquet", index=False)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        old = None
        if target.exists():
            old = home / f".ingest-old-{os.getpid()}"
            target.rename(old)
        tmp.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read_ingested(home: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(prices long frame, raw master, meta) of the ingested data set."""
    recover_ingested(home)
    folder = ingested_dir(home)
    if not (folder / "prices.parquet").exists():
        raise FileNotFoundError(
            f"no ingested data under {folder}: run `eqrisk ingest PRICES --master FILE` "
            "or `eqrisk demo` first"
        )
    prices = pq.read_table(folder / "prices.parquet").to_pandas()
    master = pd.read_parquet(folder / "master.parquet")
    meta = json.loads((folder / "meta.json").read_text())
    return prices, master, meta


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

    @property
    def shape(self) -> tuple[int, int]:
        return self.close.shape

    def index_of(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.symbols.tolist())}


def to_panel(
    prices: pd.DataFrame,
    master: pd.DataFrame | None = None,
    share_classes: dict[str, str] | None = None,
) -> Panel:
    """Pivot a long price frame onto the NYSE sessions between its first and last date.

    Market cap: the row's `market_cap` where given, else shares (from the master) x adjusted
    close. A master's share count is one number, today's; the adjusted close is today's price
    scaled back through splits, so their product is the cap history without split jumps (raw
    close x today's shares would overstate every pre-split cap by the split ratio). Share
    classes of one company (`share_classes`, symbol -> company; None: the project's map) count
    the company's cap once (`share_classes.company_caps`).
    """
    frame = prices.copy()
    frame["date"] = pd.to_datetime(frame["date"]).dt.normalize()
    symbols = np.array(sorted(frame["symbol"].unique()), dtype=object)
    sessions = sessions_between(frame["date"].min(), frame["date"].max())
    sess_idx = pd.Index(sessions)
    sym_idx = pd.Index(symbols)
    rows = sym_idx.get_indexer(pd.Index(frame["symbol"]))
    cols = sess_idx.get_indexer(pd.Index(frame["date"]))
    if (cols < 0).any():
        bad = frame.loc[cols < 0, "date"].dt.date.unique()[:5]
        raise ValueError(f"prices hold dates that are not NYSE sessions: {list(bad)}")
    shape = (len(symbols), len(sessions))
    arrays: dict[str, np.ndarray] = {}
    for field in PANEL_FIELDS:
        arr = np.full(shape, np.nan)
        if field in frame.columns:
            arr[rows, cols] = pd.to_numeric(frame[field], errors="coerce").to_numpy(float)
        arrays[field] = arr
    if master is not None and "shares" in master.columns:
        shares = (
            pd.to_numeric(master.set_index("symbol")["shares"], errors="coerce")
            .reindex(symbols)
            .to_numpy(float)
        )
        implied = shares[:, None] * arrays["close"]
        arrays["market_cap"] = np.where(
            np.isnan(arrays["market_cap"]), implied, arrays["market_cap"]
        )
    classes = read_share_classes() if share_classes is None else share_classes
    arrays["market_cap"] = company_caps(arrays["market_cap"], symbols, classes)
    return Panel(
        symbols=symbols,
        sessions=sessions.to_numpy().astype("datetime64[D]"),
        **{k: np.ascontiguousarray(v) for k, v in arrays.items()},
    )
