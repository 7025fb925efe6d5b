"""The spec's long table (`security_history`) of a version: its daily rows generated from the
arrays (or read where an older version stores them), its monthly rows read from the version's
Parquet files, and its export as the files a version held before layout `chunks-2`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from eqrisk.snapshot import chunks, tables


class Snapshot(Protocol):
    """What the long table reads of a version (`version.Snapshot`, whose methods call these
    functions: so this module imports it not)."""

    @property
    def path(self) -> Path: ...
    @property
    def manifest(self) -> dict[str, Any]: ...
    @property
    def chunked(self) -> bool: ...
    @property
    def sessions(self) -> np.ndarray: ...
    @property
    def row_of(self) -> dict[str, int]: ...
    @property
    def symbol_names(self) -> list[str]: ...
    def array(self, field: str) -> chunks.FieldArray: ...


def stores_daily(snap: Snapshot) -> bool:
    """Whether the long table's daily rows are files of the version (versions written before
    layout `chunks-2`); else they are generated from the arrays on read."""
    if not snap.chunked:
        return True
    return any(Path(f).name.startswith("daily-") for f in snap.manifest["security_history"])


def read(snap: Snapshot, filters: dict[str, Any]) -> pd.DataFrame:
    """The long table, optionally filtered by column equality (pushed down): the daily rows
    (generated from the arrays, or read where a version stores them), then the monthly rows
    (stored)."""
    expr: list[Any] = [(k, "=", v) for k, v in filters.items()]
    if not snap.chunked:
        source = snap.path / "security_history.parquet"
        return pq.read_table(source, filters=expr or None).to_pandas()
    files = [str(snap.path / rel) for rel in snap.manifest["security_history"]]
    parts = [] if stores_daily(snap) else [_daily(snap, filters, expr)]
    if files:
        parts.append(pq.ParquetDataset(files, filters=expr or None).read())
    if not parts:
        return tables.history_schema().empty_table().to_pandas()
    schema = tables.history_schema()
    return pa.concat_tables([part.cast(schema) for part in parts]).to_pandas()


def _daily(snap: Snapshot, filters: dict[str, Any], expr: list[Any]) -> pa.Table:
    """The daily rows of the long table from the arrays (a symbol filter reads that symbol's
    rows only), the other filters applied after."""
    rows = None
    if "symbol" in filters:
        at = snap.row_of.get(str(filters["symbol"]))
        rows = np.array([] if at is None else [at], dtype=np.int64)
    fields = {name: snap.array(name) for name in tables.HISTORY_KEYS.values()}
    grid = chunks.ChunkGrid.of(snap.manifest["arrays"]["grid"])
    names = snap.symbol_names
    found = [t for _c, t in tables.daily_tables(fields, names, snap.sessions, grid, rows)]
    table = pa.concat_tables(found) if found else tables.history_schema().empty_table()
    if expr:
        table = table.filter(pq.filters_to_expression(expr))
    return table


def export(snap: Snapshot, out: Path) -> list[Path]:
    """Write the long table as a Parquet dataset into the folder `out` (the files a version
    held before `chunks-2`: `daily-<chunk>.parquet` from the arrays, and a copy of each
    `monthly-<year>.parquet`; an older version's files are copied as they are). Returns the
    files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if not snap.chunked:
        target = out / "security_history.parquet"
        shutil.copyfile(snap.path / "security_history.parquet", target)
        return [target]
    if not stores_daily(snap):
        fields = {name: snap.array(name) for name in tables.HISTORY_KEYS.values()}
        grid = chunks.ChunkGrid.of(snap.manifest["arrays"]["grid"])
        for c, table in tables.daily_tables(fields, snap.symbol_names, snap.sessions, grid):
            if table.num_rows:
                target = out / tables.daily_file(c).name
                target.write_bytes(tables.parquet_bytes(table))
                written.append(target)
    for rel in snap.manifest["security_history"]:
        target = out / Path(rel).name
        shutil.copyfile(snap.path / rel, target)
        written.append(target)
    return written
