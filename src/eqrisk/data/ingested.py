"""The ingested data set on disk: a partitioned Parquet dataset and its statistics.

```
<home>/ingested/
  meta.json                     what the ingest recorded (basis, breaks, counts, layout)
  master.parquet                the raw security master
  prices/<block>/<year>.parquet the price rows of one symbol block and one calendar year,
                                sorted by (symbol, date)
  index.parquet                 per partition and symbol: rows, first and last date, cap cells
  days.parquet                  per partition and session: rows
  parts.parquet                 per partition: the digest of its file (XXH3-128 of its bytes)
```

A symbol keeps its block for the life of the data set: the first ingest deals the symbols out in
name order, `block_symbols` (meta `layout`) to a block; a merge puts a new symbol in the last
block while it has room, else opens a block. So a merge of one session rewrites the current
year's file of each block and links every other file unchanged; the statistics answer what a
merge needs of the whole data set (its symbols, sessions, per-session counts) without reading
a price, and the partitions' digests tell a build which years a merge left as they were (an
incremental build reads only the years after them).

Every write makes a new folder (`.ingest-new-<pid>-*`: written and linked files, statistics,
master, meta) swapped into place by two renames (the old one to `.ingest-old-<pid>`, the new
one to `ingested`); a writer killed between them leaves the old set beside, and the next
reader or writer (`recover_ingested`) puts it back. A data set written before partitions
(`prices.parquet` in the folder) is read as it is; the next write stores it partitioned.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from eqrisk.data.calendar import sessions_between
from eqrisk.data.panel import (
    MODEL_FIELDS,
    PANEL_FIELDS,
    PRICE_COLUMNS,
    RAW_MASTER_COLUMNS,
    Cells,
    Panel,
    fill_panel,
    fill_rows,
)

# Symbols per block of a new data set (recorded in its meta; a data set keeps its own).
BLOCK_SYMBOLS = 512
LEGACY_FILE = "prices.parquet"
PARTS_FILE = "parts.parquet"

_PRICE_FIELDS: list[tuple[str, pa.DataType]] = [("date", pa.date32()), ("symbol", pa.string())]
_PRICE_SCHEMA = pa.schema(_PRICE_FIELDS + [(c, pa.float64()) for c in PRICE_COLUMNS[2:]])
Part = tuple[int, int]  # (block, year)


def ingested_dir(home: Path) -> Path:
    return Path(home) / "ingested"


def part_path(folder: Path, part: Part) -> Path:
    return folder / "prices" / f"{part[0]:04d}" / f"{part[1]}.parquet"


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


@dataclass(frozen=True)
class Stats:
    """The statistics of a partitioned data set: `index` (block, year, symbol, rows, first,
    last, capped: the rows with a market cap) and `days` (block, year, date, rows)."""

    index: pd.DataFrame
    days: pd.DataFrame

    @classmethod
    def of(cls, rows: pd.DataFrame) -> Stats:
        """The statistics of price rows that carry their `block` and `year`."""
        if rows.empty:
            return cls(_empty_index(), _empty_days())
        capped = np.isfinite(pd.to_numeric(rows["market_cap"], errors="coerce").to_numpy(float))
        work = rows[["block", "year", "symbol", "date"]].assign(capped=capped)
        grouped = work.groupby(["block", "year", "symbol"], sort=True, observed=True)
        index = grouped.agg(
            rows=("date", "size"), first=("date", "min"), last=("date", "max"),
            capped=("capped", "sum"),
        ).reset_index()  # fmt: skip
        days = work.groupby(["block", "year", "date"], sort=True).size().rename("rows")
        return cls(_typed_index(index), _typed_days(days.reset_index()))

    def parts(self, symbols: set[str] | None = None) -> list[Part]:
        """The partitions (block, year), in order; with `symbols`, those holding any of them."""
        index = self.index if symbols is None else self.index[self.index["symbol"].isin(symbols)]
        pairs = index[["block", "year"]].drop_duplicates()
        return [(int(b), int(y)) for b, y in zip(pairs["block"], pairs["year"], strict=True)]

    def blocks(self) -> dict[str, int]:
        """symbol -> block."""
        first = self.index.drop_duplicates("symbol")
        return dict(zip(first["symbol"].astype(str), first["block"].astype(int), strict=True))

    def symbols(self) -> pd.DataFrame:
        """Per symbol: rows, first and last date, capped (rows with a market cap)."""
        grouped = self.index.groupby("symbol", sort=True)
        summary = grouped.agg(
            rows=("rows", "sum"), first=("first", "min"), last=("last", "max"),
            capped=("capped", "sum"),
        )  # fmt: skip
        return summary.reset_index()

    def sessions(self) -> pd.Series:
        """Rows per session (datetime64 index, sorted)."""
        counts = self.days.groupby("date", sort=True)["rows"].sum()
        counts.index = pd.DatetimeIndex(counts.index)
        return counts

    def replaced(self, parts: set[Part], rows: pd.DataFrame) -> Stats:
        """These statistics with those of `parts` recomputed from `rows` (their new content)."""
        new = Stats.of(rows)

        # A partition as one number (block, year) -> block * 100,000 + year: vectorised.
        gone = np.asarray([b * 100_000 + y for b, y in parts], dtype=np.int64)

        def keep(frame: pd.DataFrame) -> pd.DataFrame:
            key = frame["block"].to_numpy(np.int64) * 100_000 + frame["year"].to_numpy(np.int64)
            return frame[~np.isin(key, gone)]

        index = pd.concat([keep(self.index), new.index], ignore_index=True)
        days = pd.concat([keep(self.days), new.days], ignore_index=True)
        index = index.sort_values(["block", "year", "symbol"], ignore_index=True)
        return Stats(_typed_index(index), _typed_days(days.sort_values(["block", "year", "date"])))


def _empty_index() -> pd.DataFrame:
    return _typed_index(pd.DataFrame(columns=["block", "year", "symbol", "rows", "first", "last",
                                              "capped"]))  # fmt: skip


def _empty_days() -> pd.DataFrame:
    return _typed_days(pd.DataFrame(columns=["block", "year", "date", "rows"]))


def _typed_index(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.astype({"block": "int64", "year": "int64", "rows": "int64", "capped": "int64"})
    out["symbol"] = out["symbol"].astype(object)
    for col in ("first", "last"):
        out[col] = pd.to_datetime(out[col]).astype("datetime64[ns]")
    return out.reset_index(drop=True)


def _typed_days(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.astype({"block": "int64", "year": "int64", "rows": "int64"})
    out["date"] = pd.to_datetime(out["date"]).astype("datetime64[ns]")
    return out.reset_index(drop=True)


@dataclass(frozen=True)
class Stored:
    """An ingested data set as found on disk: its folder, meta, statistics and layout."""

    folder: Path
    meta: dict[str, Any]
    stats: Stats
    block_symbols: int
    legacy: bool  # one prices.parquet (a data set written before partitions)
    digests: dict[Part, str] | None = None  # per partition (None: written before digests)

    def symbols(self) -> np.ndarray:
        """The universe's rows: every symbol priced, sorted (a panel's row order)."""
        return np.array(sorted(self.stats.index["symbol"].unique()), dtype=object)

    def calendar(self) -> pd.DatetimeIndex:
        """The universe's columns: the NYSE sessions from the first priced one to the last
        (empty when nothing is priced)."""
        days = self.stats.sessions()
        if days.empty:
            return pd.DatetimeIndex([])
        return sessions_between(days.index.min(), days.index.max())

    def read(
        self,
        parts: list[Part] | None = None,
        *,
        start: pd.Timestamp | None = None,
        symbols: list[str] | None = None,
        columns: list[str] | None = None,
    ) -> pd.DataFrame:
        """Price rows of `parts` (None: all), on or after `start`, of `symbols` (None: all);
        date as datetime64[ns], symbol as str. Unsorted across partitions."""
        files = (
            [self.folder / LEGACY_FILE]
            if self.legacy
            else [
                part_path(self.folder, p) for p in (self.stats.parts() if parts is None else parts)
            ]
        )
        tables = [_read_filtered(f, start, symbols, columns) for f in files if f.exists()]
        if not tables:
            return _to_frame(_PRICE_SCHEMA.empty_table().select(columns or PRICE_COLUMNS))
        return _to_frame(pa.concat_tables(tables))


def _read_filtered(
    path: Path, start: pd.Timestamp | None, symbols: list[str] | None, columns: list[str] | None
) -> pa.Table:
    table = pq.read_table(path, columns=columns)
    mask = None
    if start is not None:
        mask = pc.greater_equal(table["date"], pa.scalar(start.date(), pa.date32()))
    if symbols is not None:
        inside = pc.is_in(table["symbol"], value_set=pa.array(list(symbols), pa.string()))
        mask = inside if mask is None else pc.and_(mask, inside)
    return table if mask is None else table.filter(mask)


def _to_frame(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas(date_as_object=False)
    if "date" in frame.columns:
        frame["date"] = pd.to_datetime(frame["date"]).astype("datetime64[ns]")
    if "symbol" in frame.columns:
        frame["symbol"] = frame["symbol"].astype(object)
    return frame


def stored(home: Path) -> Stored | None:
    """The ingested data set (None when there is none)."""
    recover_ingested(home)
    folder = ingested_dir(home)
    if not (folder / "meta.json").exists():
        return None
    meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
    if (folder / LEGACY_FILE).exists():
        table = pq.read_table(folder / LEGACY_FILE, columns=["date", "symbol", "market_cap"])
        rows = _to_frame(table).assign(block=0)
        rows["year"] = rows["date"].dt.year
        return Stored(folder, meta, Stats.of(rows), BLOCK_SYMBOLS, legacy=True)
    if not (folder / "index.parquet").exists():
        return None
    stats = Stats(
        _typed_index(pd.read_parquet(folder / "index.parquet")),
        _typed_days(pd.read_parquet(folder / "days.parquet")),
    )
    layout = meta.get("layout", {})
    digests = None
    if (folder / PARTS_FILE).exists():
        parts = pd.read_parquet(folder / PARTS_FILE)
        digests = {
            (int(b), int(y)): str(d)
            for b, y, d in zip(parts["block"], parts["year"], parts["digest"], strict=True)
        }
    block_symbols = int(layout.get("block_symbols", BLOCK_SYMBOLS))
    return Stored(folder, meta, stats, block_symbols, False, digests)


def assign_blocks(symbols: list[str], known: dict[str, int], block_symbols: int) -> dict[str, int]:
    """`known` plus each new symbol (in name order) in the last block while it has fewer than
    `block_symbols` symbols, else in a new block."""
    out = dict(known)
    sizes: dict[int, int] = {}
    for block in out.values():
        sizes[block] = sizes.get(block, 0) + 1
    last = max(sizes) if sizes else 0
    for symbol in sorted(set(symbols) - set(out)):
        if sizes.get(last, 0) >= block_symbols:
            last += 1
        out[symbol] = last
        sizes[last] = sizes.get(last, 0) + 1
    return out


def with_parts(rows: pd.DataFrame, blocks: dict[str, int]) -> pd.DataFrame:
    """`rows` with their `block` and `year` columns."""
    block = rows["symbol"].map(blocks)
    if block.isna().any():
        raise ValueError("rows of a symbol without a block")
    year = pd.DatetimeIndex(rows["date"]).year
    return rows.assign(block=block.to_numpy(np.int64), year=np.asarray(year, dtype=np.int64))


@dataclass(frozen=True)
class Placed:
    """Price rows dealt into partitions for a write: the rows with their `block` and `year`,
    the partitions they fill, and the statistics of the data set once they are written."""

    rows: pd.DataFrame
    parts: set[Part]
    stats: Stats
    block_symbols: int
    base: Stored | None  # the partitioned set the other partitions are linked from


def place(
    prices: pd.DataFrame, base: Stored | None = None, block_symbols: int | None = None
) -> Placed:
    """Deal `prices` into partitions. Without `base` (or a `base` in the one-file layout):
    `prices` is the whole data set, dealt into blocks of `block_symbols` (None: BLOCK_SYMBOLS)
    afresh. With a partitioned `base`: `prices` is the whole new content of the partitions it
    touches (every row of their (block, year)), in the stored set's blocks."""
    merge = base if base is not None and not base.legacy else None
    size = merge.block_symbols if merge is not None else block_symbols or BLOCK_SYMBOLS
    known = merge.stats.blocks() if merge is not None else {}
    rows = with_parts(_normal(prices), assign_blocks(list(prices["symbol"].unique()), known, size))
    written = {(int(b), int(y)) for b, y in rows[["block", "year"]].drop_duplicates().to_numpy()}
    stats = merge.stats.replaced(written, rows) if merge is not None else Stats.of(rows)
    return Placed(rows, written, stats, size, merge)


def write_ingested(
    home: Path,
    prices: pd.DataFrame | Placed,
    master: pd.DataFrame,
    meta: dict[str, Any],
    *,
    base: Stored | None = None,
    block_symbols: int | None = None,
) -> Path:
    """Write the ingested data set; readers see the old one or the new one, whole, and a kill at
    any point leaves one of them (`recover_ingested` restores a set left aside).

    `prices`: rows as `place` takes them (with `base` and `block_symbols`), or placed already;
    the partitions they do not fill are linked from the placement's base unread."""
    home = Path(home)
    target = ingested_dir(home)
    home.mkdir(parents=True, exist_ok=True)
    recover_ingested(home)
    placed = prices if isinstance(prices, Placed) else place(prices, base, block_symbols)
    rows, written, stats = placed.rows, placed.parts, placed.stats
    tmp = Path(tempfile.mkdtemp(prefix=f".ingest-new-{os.getpid()}-", dir=home))
    digests: dict[Part, str] = {}
    try:
        for key, group in rows.groupby(["block", "year"], sort=True):
            block, year = cast(tuple[int, int], key)
            part = (int(block), int(year))
            digests[part] = _write_part(part_path(tmp, part), group)
        if placed.base is not None:
            known = placed.base.digests or {}
            for part in sorted(set(stats.parts()) - written):
                _link(part_path(placed.base.folder, part), part_path(tmp, part))
                digests[part] = known.get(part) or file_digest(part_path(tmp, part))
        _write_digests(tmp / PARTS_FILE, digests)
        stats.index.to_parquet(tmp / "index.parquet", index=False)
        stats.days.to_parquet(tmp / "days.parquet", index=False)
        raw = master.reindex(columns=RAW_MASTER_COLUMNS)
        raw["shares"] = pd.to_numeric(raw["shares"], errors="coerce")
        for col in RAW_MASTER_COLUMNS[:-1]:
            raw[col] = raw[col].astype("string")
        raw.to_parquet(tmp / "master.parquet", index=False)
        layout = {"format": "partitioned", "block_symbols": placed.block_symbols}
        (tmp / "meta.json").write_text(
            json.dumps({**meta, "layout": layout}, indent=2, default=str)
        )
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


def _normal(prices: pd.DataFrame) -> pd.DataFrame:
    frame = prices.reindex(columns=PRICE_COLUMNS)
    frame["date"] = pd.to_datetime(frame["date"]).astype("datetime64[ns]")
    frame["symbol"] = frame["symbol"].astype(str)
    return frame


def _write_part(path: Path, part: pd.DataFrame) -> str:
    """Write one partition's file; return its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = part[PRICE_COLUMNS].sort_values(["symbol", "date"], kind="stable")
    frame = frame.assign(date=frame["date"].dt.date)
    table = pa.Table.from_pandas(frame, schema=_PRICE_SCHEMA, preserve_index=False)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = sink.getvalue()
    path.write_bytes(memoryview(data))
    return xxhash.xxh3_128_hexdigest(memoryview(data))


def file_digest(path: Path) -> str:
    """A partition file's digest: XXH3-128 of its bytes (the same rows written again give the
    same bytes, so a rewritten but unchanged partition keeps its digest)."""
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def _write_digests(path: Path, digests: dict[Part, str]) -> None:
    keys = sorted(digests)
    frame = pd.DataFrame(
        {
            "block": [b for b, _ in keys],
            "year": [y for _, y in keys],
            "digest": [digests[k] for k in keys],
        }
    )
    frame.to_parquet(path, index=False)


def _link(source: Path, dest: Path) -> None:
    """A partition the write leaves as it was: a hard link, a copy where links fail."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def read_ingested(home: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(prices long frame sorted by (symbol, date), raw master, meta) of the ingested data set."""
    found = stored(home)
    if found is None:
        raise FileNotFoundError(
            f"no ingested data under {ingested_dir(home)}: run `eqrisk ingest PRICES --master "
            "FILE` or `eqrisk demo` first"
        )
    prices = found.read()
    prices = prices.sort_values(["symbol", "date"], kind="stable", ignore_index=True)
    prices["date"] = prices["date"].dt.date
    master = pd.read_parquet(found.folder / "master.parquet")
    return prices, master, found.meta


def ingested_counts(home: Path) -> tuple[int, int] | None:
    """(symbols, sessions) of the ingested data set, or None when there is none."""
    found = stored(home)
    if found is None:
        return None
    counts = found.meta.get("counts", {})
    if "symbols" in counts and "sessions" in counts:
        return int(counts["symbols"]), int(counts["sessions"])
    return int(found.stats.index["symbol"].nunique()), len(found.stats.sessions())


def ingested_source(home: Path) -> str | None:
    """The `data_source` of the ingested data set, or None when there is none."""
    found = stored(home)
    return None if found is None else str(found.meta.get("data_source", "unknown"))


def read_master(found: Stored) -> pd.DataFrame:
    return pd.read_parquet(found.folder / "master.parquet")


def read_panel(
    found: Stored,
    master: pd.DataFrame | None,
    share_classes: dict[str, str] | None = None,
    since: pd.Timestamp | None = None,
    fields: tuple[str, ...] = PANEL_FIELDS,
    until: pd.Timestamp | None = None,
    others_since: pd.Timestamp | None = None,
) -> Panel:
    """The data set as a `Panel`, filled one partition file at a time (beside the panel,
    memory holds one file's cells; symbols and dates stay Arrow dictionary codes and integers,
    never Python objects). `since`: only the sessions from that one on (a session), read from
    the partitions of its year and after. `fields`: the fields read (`fill_panel`); a full
    build reads MODEL_FIELDS here and the others block by block (`read_rows`). `until`: only
    the sessions up to that one (a session), from the partitions of its year and before.
    `others_since`: the fields beyond MODEL_FIELDS read from the partitions of that session's
    year on only, and held from that year's first session on (`Panel.others_from`: what a
    tail build reads: the model's fields from its window's base, the others from its first
    digested chunk)."""
    symbols = found.symbols()
    sessions = found.stats.sessions()
    if sessions.empty:
        raise ValueError(f"the ingested data set under {found.folder} holds no price")
    first = sessions.index.min() if since is None else pd.Timestamp(since)
    last = sessions.index.max() if until is None else pd.Timestamp(until)
    span = (first, last)
    day = None if since is None else np.datetime64(first.date(), "D")
    end = None if until is None else np.datetime64(last.date(), "D")
    if found.legacy:
        pieces: Iterable[Cells] = [_cells(found.folder / LEGACY_FILE, day, fields, end)]
    else:
        parts = [p for p in found.stats.parts() if first.year <= p[1] <= last.year]
        before = -1 if others_since is None else pd.Timestamp(others_since).year
        # A partition of a year after `since`'s (before `until`'s) holds no row to filter out.
        pieces = (
            _cells(
                part_path(found.folder, p),
                day if p[1] == first.year else None,
                MODEL_FIELDS if p[1] < before else fields,
                end if p[1] == last.year else None,
            )
            for p in parts
        )
    others_year = None  # the legacy file's one piece holds every field of every session
    if (
        not found.legacy
        and others_since is not None
        and pd.Timestamp(others_since).year > first.year
    ):
        others_year = pd.Timestamp(year=pd.Timestamp(others_since).year, month=1, day=1)
    return fill_panel(pieces, symbols, span, master, share_classes, fields, others_year)


def read_rows(
    found: Stored, symbols: np.ndarray, sessions: np.ndarray, fields: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """`fields` of some symbols (rows) on `sessions` (columns, datetime64[D]), as a panel
    read with those fields holds them: read from the partitions that hold these symbols only
    (the rows of the others in them skipped). Fields a market cap is derived for are not
    read here (`fill_panel` derives the cap from the whole universe)."""
    if "market_cap" in fields:
        raise ValueError("the market cap is derived for the whole universe (read_panel)")
    if found.legacy:
        files = [found.folder / LEGACY_FILE]
    else:
        parts = found.stats.parts(set(symbols.tolist()))
        files = [part_path(found.folder, p) for p in parts]
    return fill_rows(
        (_cells(f, None, fields) for f in files), symbols, sessions, fields, others=True
    )


def _cells(
    path: Path,
    since: np.datetime64 | None = None,
    fields: tuple[str, ...] = PANEL_FIELDS,
    until: np.datetime64 | None = None,
) -> Cells:
    with pq.ParquetFile(path, read_dictionary=["symbol"]) as file:
        columns = [c for c in file.schema_arrow.names if c in ("date", "symbol", *fields)]
        table = file.read(columns=columns)
    if since is not None:
        table = table.filter(pc.greater_equal(table["date"], pa.scalar(since.item(), pa.date32())))
    if until is not None:
        table = table.filter(pc.less_equal(table["date"], pa.scalar(until.item(), pa.date32())))
    symbol = table["symbol"].combine_chunks()
    if isinstance(symbol, pa.DictionaryArray):
        names = np.asarray(symbol.dictionary.to_pylist(), dtype=object)
        codes = symbol.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    else:  # pragma: no cover - read_dictionary always gives one
        codes, names = pd.factorize(symbol.to_numpy(zero_copy_only=False))
    days = table["date"].cast(pa.int32()).to_numpy().astype("datetime64[D]")
    values = {field: table[field].to_numpy().astype(float) for field in fields if field in columns}
    return Cells(names, codes, days, values)


def last_closes(found: Stored, before: pd.Timestamp) -> pd.DataFrame:
    """Per symbol, its last row (date, symbol, close) with a close dated before `before`: read
    from each symbol's latest partition that starts before it."""
    index = found.stats.index
    began = index[index["first"] < before].sort_values("year", kind="stable")
    latest = began.drop_duplicates("symbol", keep="last")
    parts = sorted({(int(b), int(y)) for b, y in zip(latest["block"], latest["year"], strict=True)})
    rows = found.read(parts, columns=["date", "symbol", "close"]) if parts else None
    if rows is None or rows.empty:
        return pd.DataFrame({"date": [], "symbol": [], "close": []})
    rows = rows.loc[(rows["date"] < before) & rows["close"].notna()]
    return rows.sort_values("date", kind="stable").groupby("symbol").tail(1)
