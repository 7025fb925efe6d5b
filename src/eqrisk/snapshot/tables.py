"""What one snapshot version holds, and how it is laid out on disk (see `versions` for the folder).

The numbers are stored once, as per-metric arrays (symbols x sessions, in chunks along time:
`chunks`) that the services slice directly; the spec's tables are `symbols` (Parquet) and
`security_history` in long entity-attribute-value form: its monthly rows (aggregates) as Parquet
files per year, its daily rows generated from the arrays (`daily_tables`) on read or for an
export. Files are cut at fixed session boundaries so that a version shares every unchanged
file with the previous one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import eqrisk
from eqrisk.data.panel import Panel
from eqrisk.model.run import ModelResult
from eqrisk.snapshot import chunks
from eqrisk.snapshot.spliced import Spliced

# The spec's metric keys (security_history.metric_key) and the arrays behind them.
HISTORY_KEYS: dict[str, str] = {
    "return": "log_return",
    "L3_market_HR": "l3_mkt_hr",
    "L3_sector_HR": "l3_sec_hr",
    "L3_subsector_HR": "l3_sub_hr",
    "L3_market_ER": "l3_mkt_er",
    "L3_sector_ER": "l3_sec_er",
    "L3_subsector_ER": "l3_sub_er",
    "L3_residual_risk": "l3_res_er",
    "vol_23d": "vol_23d",
    "vol_252d_ann": "vol_252d_ann",
    "price_close": "price_close",
    "L1_hedge_quality": "l1_hq",
    "L2_hedge_quality": "l2_hq",
    "L3_hedge_quality": "l3_hq",
}
PANEL_ARRAYS = ("open", "high", "low", "close_raw", "volume")

_HISTORY_SCHEMA = pa.schema(
    [
        ("symbol", pa.dictionary(pa.int32(), pa.string())),
        ("teo", pa.date32()),
        ("metric_key", pa.dictionary(pa.int8(), pa.string())),
        ("value", pa.float64()),
        ("periodicity", pa.dictionary(pa.int8(), pa.string())),
    ]
)


@dataclass(frozen=True)
class Reuse:
    """An incremental build's licence: time chunks c < `chunks` of the `previous` version are
    what a full rebuild would write (their inputs' digests match), so they are linked unread.
    `last`/`first` give each row's last and first priced session (the symbols table's), which
    the metrics (lazy before the reused point) cannot give without reading every chunk."""

    chunks: int
    previous: Path
    manifest: Mapping[str, Any]
    last: np.ndarray
    first: np.ndarray
    build: dict[str, Any]


@dataclass(frozen=True)
class Staged:
    """The arrays of a version already written, block by block, by the workers of a Dask build
    into `folder/arrays` (on the store every host mounts), with what the driver keeps of them:
    the manifest's `arrays` block, the write stats, each row's first and last priced session
    and the value there of every metric (`latest`, the symbols table's); no (n x T) array."""

    folder: Path
    arrays: dict[str, Any]
    stats: chunks.WriteStats
    last: np.ndarray
    first: np.ndarray
    latest: dict[str, np.ndarray]

    def adopt(self, folder: Path) -> tuple[dict[str, Any], chunks.WriteStats]:
        """Move the written arrays into the version folder being built (one rename)."""
        os.replace(self.folder / "arrays", folder / "arrays")
        return self.arrays, self.stats


@dataclass(frozen=True)
class SnapshotContent:
    """Everything a build produced: the model result, the panel it came from, the master."""

    result: ModelResult
    panel: Panel
    master: pd.DataFrame  # classified (eqrisk.data.master.MASTER_COLUMNS)
    data_source: str
    ingest: dict[str, Any]
    reuse: Reuse | None = None
    inputs: dict[str, Any] | None = None  # digests of the model's inputs (`incremental`)
    build: dict[str, Any] | None = None  # how it was built and why (full / incremental)
    staged: Staged | None = None  # arrays the workers of a Dask build wrote already
    block: int = chunks.BLOCK_SYMBOLS  # symbols per block of the chunk grid (S)
    more: MoreFiles | None = None  # what the build writes besides (the risk model)


class MoreFiles(Protocol):
    """Files a build writes into a version besides its arrays and tables (the risk model,
    `eqrisk.build.risk_run.risk_files`), once the arrays are written: given the version
    folder, its fields as written and the chunk grid, it writes them and returns the
    manifest's entries that describe them."""

    def __call__(
        self, folder: Path, fields: Mapping[str, Any], grid: chunks.ChunkGrid
    ) -> dict[str, Any]: ...


def write_content(
    folder: Path,
    content: SnapshotContent,
    *,
    version: str,
    previous: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write every file of a version into `folder`; return the manifest (written last).

    Arrays and the long table go in chunks along time (`chunks`); a chunk equal to the one of
    the `previous` version folder is a hard link to it."""
    say = progress or (lambda _msg: None)
    result, panel, reuse = content.result, content.panel, content.reuse
    folder.mkdir(parents=True, exist_ok=True)
    if reuse is not None:
        previous = reuse.previous
    fields, grid, arrays, stats = _write_arrays(folder, content, previous, say)
    np.save(folder / "sessions.npy", panel.sessions.astype("datetime64[D]"))
    np.save(folder / "factors.npy", np.ascontiguousarray(result.flat.returns, dtype=np.float64))

    say("writing symbols table")
    symbols = symbols_table(content)
    pq.write_table(pa.Table.from_pandas(symbols, preserve_index=False), folder / "symbols.parquet")

    def history_of(read: Mapping[str, Any]) -> list[str]:
        return write_security_history(
            folder,
            read,
            result.symbols.tolist(),
            panel.sessions,
            grid,
            previous=previous,
            stats=stats,
            progress=say,
            reuse=reuse.chunks if reuse is not None else 0,
            previous_files=reuse.manifest["security_history"] if reuse is not None else None,
        )

    say("writing security_history")
    more: dict[str, Any] = {}
    if content.more is not None and content.staged is not None:
        # The arrays are files: the long table reads them through a mapping of its own (its
        # `close_files` and the risk model's leave each other's alone) on a thread, beside
        # the risk model, which leaves part of a core idle (docs/decisions/builds.md).
        with ThreadPoolExecutor(1, thread_name_prefix="eqrisk-history") as pool:
            pending = pool.submit(history_of, chunks.open_arrays(folder, arrays))
            say("writing the risk model (F, D, predicted volatility)")
            more = content.more(folder, fields, grid)
            history = pending.result()
    else:
        history = history_of(fields)
        if content.more is not None:
            say("writing the risk model (F, D, predicted volatility)")
            more = content.more(folder, fields, grid)
    manifest = {
        **_manifest_head(content, version, symbols),
        "fields": sorted(fields),
        "factors": {
            "names": result.flat.names,
            "sources": [result.factor_keys[i] if i >= 0 else None for i in result.flat.sources],
        },
        "arrays": arrays,
        "security_history": history,
        "storage": {
            **stats.describe(),
            "derived": stats.derived,
            "previous": previous.name if previous is not None else None,
        },
        "ingest": content.ingest,
        "model": result.notes,
        "inputs": content.inputs,
        "build": content.build or {"mode": "full"},
        **more,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def _write_arrays(
    folder: Path, content: SnapshotContent, previous: Path | None, say: Callable[[str], None]
) -> tuple[dict[str, Any], chunks.ChunkGrid, dict[str, Any], chunks.WriteStats]:
    """The version's arrays: taken over from the Dask workers' staging folder, or written here
    from the result and the panel (chunks before `reuse.chunks` linked from `previous`); the
    fields as the rest of the version reads them, the grid, the manifest's `arrays` block and
    the write stats."""
    result, panel, reuse, staged = content.result, content.panel, content.reuse, content.staged
    fields: dict[str, Any] = dict(result.metrics)
    for name in PANEL_ARRAYS:
        fields[name] = panel.field(name)
    block = content.block
    if reuse is not None:
        block = int(reuse.manifest["arrays"]["grid"]["block"])
    if staged is not None:
        block = int(staged.arrays["grid"]["block"])
    grid = chunks.ChunkGrid(len(result.symbols), len(panel.sessions), block)
    if staged is not None:
        say("taking the arrays the workers wrote")
        arrays, stats = staged.adopt(folder)
        return dict(chunks.open_arrays(folder, arrays)), grid, arrays, stats  # read chunk by chunk
    panel.require(*PANEL_ARRAYS)  # written from the panel here, not by the blocks
    (folder / "arrays").mkdir()
    say("writing arrays")
    arrays, stats = chunks.write_arrays(
        folder,
        fields,
        grid,
        previous=previous,
        progress=say,
        reuse=reuse.chunks if reuse is not None else 0,
        previous_arrays=reuse.manifest["arrays"] if reuse is not None else None,
    )
    return fields, grid, arrays, stats


def _manifest_head(content: SnapshotContent, version: str, symbols: pd.DataFrame) -> dict[str, Any]:
    """The manifest's first entries: the version, when and from what, the universe's size."""
    sessions = content.panel.sessions
    stocks = int((symbols["asset_type"] == "stock").sum())
    return {
        "model_version": version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "eqrisk_version": eqrisk.__version__,
        "data_as_of": str(sessions[-1]) if len(sessions) else None,
        "first_session": str(sessions[0]) if len(sessions) else None,
        "data_source": content.data_source,
        "method": content.result.params.describe(),
        "universe_size": len(symbols),
        "stocks": stocks,
        "etfs": len(symbols) - stocks,
        "sessions": len(sessions),
    }


def _latest_index(price: np.ndarray) -> np.ndarray:
    """Per row, the last session with a price (-1 = never priced)."""
    has = np.isfinite(price)
    last = price.shape[1] - 1 - np.argmax(has[:, ::-1], axis=1)
    return np.where(has.any(axis=1), last, -1)


def _clean(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def latest_values(arr: Any, last: np.ndarray) -> list[float | None]:
    """Each row's value at its session `last[i]` (None where -1 or not finite): one gather for
    an in-memory array, `Spliced.pick` for an incremental build's field (new sessions spliced
    onto the previous version's), else one read per row."""
    rows = np.flatnonzero(last >= 0)
    out: list[float | None] = [None] * len(last)
    if isinstance(arr, np.ndarray):
        values = arr[rows, last[rows]]
    elif isinstance(arr, Spliced):
        values = np.asarray(arr.pick(rows, last[rows]), dtype=np.float64)  # floats: exact
    else:
        values = [arr[int(i), int(last[i])] for i in rows]
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        # One finiteness test and one conversion for the column (`_clean`'s values).
        wide = values.astype(np.float64, copy=False)
        for i, v, ok in zip(rows.tolist(), wide.tolist(), np.isfinite(wide).tolist(), strict=True):
            out[i] = v if ok else None
        return out
    for i, v in zip(rows.tolist(), values, strict=True):
        out[i] = _clean(v)
    return out


def symbols_table(content: SnapshotContent) -> pd.DataFrame:
    """The spec's `symbols` table, plus `row` (index into the arrays) and classification."""
    result = content.result
    master = content.master.set_index("symbol").reindex(result.symbols)
    hierarchy = result.hierarchy.set_index("symbol").reindex(result.symbols)
    staged = content.staged
    if content.reuse is not None:
        last, first = content.reuse.last, content.reuse.first
    elif staged is not None:
        last, first = staged.last, staged.first
    else:
        price = np.asarray(result.metrics["price_close"])
        last = _latest_index(price)
        has = np.isfinite(price)
        first = np.where(has.any(axis=1), np.argmax(has, axis=1), -1)
    latest_fields = sorted(
        k for k in result.metrics if not k.endswith(("_cfr", "_rr")) and k != "resid_return"
    )
    sessions = result.sessions
    records = []
    exposure = result.flat.exposure
    # Columns as lists and each field's latest values gathered at once: a pandas lookup or a
    # scalar index per row and field cost O(n x fields) Python calls (0.7 s at 1,000 rows).
    info_cols = {
        c: master[c].tolist()
        for c in ("name", "gics_sector", "gics_sub_industry", "sector_code", "asset_type")
    }
    hier_cols = {c: hierarchy[c].tolist() for c in ("market", "sector", "subsector")}
    latest_cols = {
        k: [_clean(v) for v in staged.latest[k].tolist()]
        if staged is not None
        else latest_values(result.metrics[k], last)
        for k in latest_fields
    }
    for i, ticker in enumerate(result.symbols.tolist()):
        t = int(last[i])
        latest = {k: latest_cols[k][i] for k in latest_fields}
        metadata = {
            "company_name": _text(info_cols["name"][i]) or ticker,
            "sector": _text(info_cols["gics_sector"][i]),
            "industry": _text(info_cols["gics_sub_industry"][i]),
            "sector_code": _text(info_cols["sector_code"][i]),
            "market_etf": _text(hier_cols["market"][i]),
            "sector_etf": _text(hier_cols["sector"][i]),
            "subsector_etf": _text(hier_cols["subsector"][i]),
        }
        res = latest.get("l3_res_er")
        records.append(
            {
                "ticker": ticker,
                "asset_type": _text(info_cols["asset_type"][i]) or "stock",
                "latest_teo": sessions[t].astype(object) if t >= 0 else None,
                "latest_vol": latest.get("vol_252d_ann"),
                "latest_er_total": None if res is None else 1.0 - res,
                "latest_hr_mkt": latest.get("l3_mkt_hr"),
                # orjson's text: compact, each float its shortest round-trip form (the
                # standard library's json.dumps took 14x as long for the same values).
                "metadata": orjson.dumps(metadata).decode(),
                "latest_metrics": orjson.dumps(latest).decode(),
                "row": i,
                "first_teo": sessions[first[i]].astype(object) if first[i] >= 0 else None,
                "name": metadata["company_name"],
                "gics_sector": metadata["sector"],
                "gics_sub_industry": metadata["industry"],
                "sector_code": metadata["sector_code"],
                "market_etf": metadata["market_etf"],
                "sector_etf": metadata["sector_etf"],
                "subsector_etf": metadata["subsector_etf"],
                "sector_factor": result.flat.names[exposure[i]] if exposure[i] >= 0 else None,
                "latest_market_cap": latest.get("market_cap"),
            }
        )
    return pd.DataFrame.from_records(records)


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return None
    return str(value) or None


def monthly_views(
    sessions: np.ndarray, level: np.ndarray, flow: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Month-end view of a (rows x keys x T) block: (values (rows x keys x M), month-end dates).

    Levels (hedge ratios, shares, vol, price): the last published value within the month.
    Flows (log returns): the sum over the month's sessions (NaN when none observed).
    """
    months = sessions.astype("datetime64[M]")
    starts = np.flatnonzero(np.r_[True, months[1:] != months[:-1]])
    ends = np.r_[starts[1:], len(sessions)] - 1
    if flow:
        filled = np.where(np.isfinite(level), level, 0.0)
        sums = np.add.reduceat(filled, starts, axis=-1)
        counts = np.add.reduceat(np.isfinite(level).astype(np.int32), starts, axis=-1)
        return np.where(counts > 0, sums, np.nan), sessions[ends]
    # The last finite value of each row within each month's sessions (`month_kernel`).
    from eqrisk.snapshot.month_kernel import month_last  # numba: builds only

    flat = np.ascontiguousarray(level, dtype=np.float64).reshape(-1, level.shape[-1])
    out = np.empty((flat.shape[0], len(starts)))
    month_last(flat, starts.astype(np.int64), ends.astype(np.int64), out)
    return out.reshape(*level.shape[:-1], len(starts)), sessions[ends]


HISTORY_DIR = "security_history"
HISTORY_WRITE = {
    "compression": "zstd",
    "use_dictionary": ["symbol", "metric_key", "periodicity"],
    "column_encoding": {"teo": "DELTA_BINARY_PACKED", "value": "BYTE_STREAM_SPLIT"},
}


def _history_table(
    symbols: pa.Array[Any],
    rows: np.ndarray | None,
    values: np.ndarray,
    dates: np.ndarray,
    periodicity: int,
) -> pa.Table:
    """Long rows of a (rows x keys x sessions) block, in (symbol, metric_key, teo) order;
    `rows` are the symbols' indexes in `symbols` (None: 0, 1, ...)."""
    sym_i, key_i, t_i = np.nonzero(np.isfinite(values))
    symbol_index = sym_i if rows is None else np.asarray(rows, dtype=np.int64)[sym_i]
    key_dict = pa.array(list(HISTORY_KEYS), type=pa.string())
    per_dict = pa.array(["daily", "monthly"], type=pa.string())
    batch = pa.record_batch(
        [
            pa.DictionaryArray.from_arrays(pa.array(symbol_index, type=pa.int32()), symbols),
            pa.array(dates[t_i], type=pa.date32()),
            pa.DictionaryArray.from_arrays(pa.array(key_i, type=pa.int8()), key_dict),
            pa.array(values[sym_i, key_i, t_i], type=pa.float64()),
            pa.DictionaryArray.from_arrays(
                pa.array(np.full(len(sym_i), periodicity), type=pa.int8()), per_dict
            ),
        ],
        schema=_HISTORY_SCHEMA,
    )
    return pa.Table.from_batches([batch])


def _history_block(
    fields: Mapping[str, chunks.Sliceable], rows: Any, lo: int, hi: int
) -> np.ndarray:
    """(rows x keys x sessions [lo, hi)) of the arrays behind the long table's metric keys."""
    first = np.asarray(fields[HISTORY_KEYS["return"]][rows, lo:hi], dtype=np.float64)
    out = np.empty((first.shape[0], len(HISTORY_KEYS), hi - lo))
    out[:, 0] = first
    for k, name in enumerate(list(HISTORY_KEYS.values())[1:], start=1):
        out[:, k] = fields[name][rows, lo:hi]  # read into its place: no second copy
    return out


def daily_tables(
    fields: Mapping[str, chunks.Sliceable],
    symbol_names: list[str],
    sessions: np.ndarray,
    grid: chunks.ChunkGrid,
    rows: np.ndarray | None = None,
    first: int = 0,
) -> Iterator[tuple[int, pa.Table]]:
    """The daily rows of the long table, per time chunk c of the grid: (c, rows of chunk c),
    generated from the arrays (the same values, in the order `daily-<c>.parquet` held them).
    `rows` limits them to those symbols (indexes into `symbol_names`, ascending), `first`
    to the chunks from it on."""
    symbols = pa.array(symbol_names, type=pa.string())
    days = np.asarray(sessions).astype("datetime64[D]")
    picked = None
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        # A few symbols: each one's whole rows read once (the per-ticker read), then cut.
        picked = np.empty((len(rows), len(HISTORY_KEYS), grid.t))
        for i, r in enumerate(rows.tolist()):
            for k, name in enumerate(HISTORY_KEYS.values()):
                picked[i, k] = np.asarray(fields[name][r, 0 : grid.t], dtype=np.float64)
    for c in range(first, grid.chunks):
        lo, hi = grid.cols(c)
        values = (
            picked[:, :, lo:hi]
            if picked is not None
            else _history_block(fields, slice(0, grid.n), lo, hi)
        )
        yield c, _history_table(symbols, rows, values, days[lo:hi], 0)


def daily_file(c: int) -> Path:
    """The file of chunk c's daily rows in the spec's Parquet dataset (an export's)."""
    return Path(HISTORY_DIR) / f"daily-{c:05d}.parquet"


def parquet_bytes(table: pa.Table) -> bytes:
    """A long-table file's bytes (the encodings of HISTORY_WRITE): the same rows, same bytes."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **HISTORY_WRITE)  # type: ignore[arg-type]
    return bytes(sink.getvalue().to_pybytes())


def _share_history(
    folder: Path, rel: Path, data: bytes, previous: Path | None, stats: chunks.WriteStats
) -> None:
    def same(old: Path) -> bool:
        return old.stat().st_size == len(data) and old.read_bytes() == data

    def write(path: Path) -> None:
        path.write_bytes(data)

    if chunks.share_or_write(folder, rel, previous, same, write):
        stats.shared += 1
    else:
        stats.written += 1
        stats.bytes_written += len(data)
        stats.written_files.append(str(rel))


def write_security_history(
    folder: Path,
    fields: Mapping[str, chunks.Sliceable],
    symbol_names: list[str],
    sessions: np.ndarray,
    grid: chunks.ChunkGrid,
    *,
    previous: Path | None = None,
    stats: chunks.WriteStats | None = None,
    progress: Callable[[str], None] | None = None,
    reuse: int = 0,
    previous_files: list[str] | None = None,
    daily: bool = False,
) -> list[str]:
    """Write the spec's long table as Parquet files under `security_history/`, one dataset:
    the monthly rows of each calendar year (`monthly-<year>.parquet`: a month's row depends
    only on that month's sessions) and, with `daily` (an export; a version does not store
    them: `daily_tables` generates them from the arrays), the daily rows of each time chunk of
    the grid (`daily-<chunk>.parquet`). A new session changes the current year's monthly file
    (and the last daily file); every other file equal to the previous version's is a hard link
    to it. With `reuse` = c0 (an incremental build), the daily files of chunks c < c0 and the
    monthly files of the years that end before chunk c0 are linked from `previous` unread.
    Returns the files written, relative to `folder`."""
    stats = stats if stats is not None else chunks.WriteStats()
    keys = list(HISTORY_KEYS)
    symbols = pa.array(symbol_names, type=pa.string())
    days = np.asarray(sessions).astype("datetime64[D]")
    flow = np.array([k == "return" for k in keys])
    files: list[str] = []
    (folder / HISTORY_DIR).mkdir(exist_ok=True)
    old = set(previous_files or [])
    if daily:
        for c in range(reuse):
            rel = daily_file(c)
            if str(rel) in old and previous is not None:
                chunks.link_unread(folder, rel, previous)
                stats.shared += 1
                files.append(str(rel))
        later = {k: v for k, v in fields.items() if k in HISTORY_KEYS.values()}
        for c, table in daily_tables(later, symbol_names, sessions, grid, first=reuse):
            if table.num_rows:
                rel = daily_file(c)
                _share_history(folder, rel, parquet_bytes(table), previous, stats)
                files.append(str(rel))
            if progress:
                progress(f"security_history daily {c + 1}/{grid.chunks}")
    years = days.astype("datetime64[Y]")
    reused_to = grid.cols(reuse)[0] if reuse else 0
    for year in np.unique(years):
        where = np.flatnonzero(years == year)
        if where[-1] < reused_to:  # the whole year lies in reused chunks
            rel = Path(HISTORY_DIR) / f"monthly-{year}.parquet"
            if str(rel) in old and previous is not None:
                chunks.link_unread(folder, rel, previous)
                stats.shared += 1
                files.append(str(rel))
            continue
        # Block by block of rows (a month's row is its symbol's alone): memory holds one
        # block's year of the fields, whatever the universe; the rows keep their order.
        pieces = []
        for b in range(grid.blocks):
            r0, r1 = grid.rows(b)
            values = _history_block(fields, slice(r0, r1), int(where[0]), int(where[-1]) + 1)
            m_level, month_dates = monthly_views(days[where], values[:, ~flow], flow=False)
            m_flow, _ = monthly_views(days[where], values[:, flow], flow=True)
            monthly = np.empty((*values.shape[:2], len(month_dates)))
            monthly[:, ~flow] = m_level
            monthly[:, flow] = m_flow
            pieces.append(_history_table(symbols, np.arange(r0, r1), monthly, month_dates, 1))
            chunks.close_files(fields)  # this block's chunk files are read: unmapped
        table = pa.concat_tables(pieces).combine_chunks()
        if table.num_rows:
            rel = Path(HISTORY_DIR) / f"monthly-{year}.parquet"
            _share_history(folder, rel, parquet_bytes(table), previous, stats)
            files.append(str(rel))
    return files


def history_schema() -> pa.Schema:
    """The schema of every `security_history` file."""
    return _HISTORY_SCHEMA
